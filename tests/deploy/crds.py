"""Validate custom resources against the published CRDs in ``data/crds`` (sources in its README).

A CRD's ``openAPIV3Schema`` is JSON Schema with Kubernetes extensions. For a strict check like
``kubectl apply --validate=strict`` an object may hold no field its schema does not declare, so every
object schema that lists ``properties`` (and neither keeps unknown fields nor declares
``additionalProperties``) gets ``additionalProperties: false``; ``x-kubernetes-int-or-string`` becomes
"an integer or a string". ``metadata`` is the API server's to check: only its name is required here.
"""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

CRDS = Path(__file__).parent / "data" / "crds"


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    schema = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("x-kubernetes-int-or-string"):
                node.pop("type", None)
                node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    schema["properties"]["metadata"] = {"type": "object", "required": ["name"]}
    return schema


@cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> strict JSON schema, for every served version of every stored CRD."""
    schemas = {}
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if version.get("served"):
                schemas[(f"{group}/{version['name']}", kind)] = _strict(version["schema"]["openAPIV3Schema"])
    return schemas


def validate_custom_resource(obj: dict[str, Any]) -> None:
    """Raises KeyError for a kind without a stored CRD, jsonschema.ValidationError for an invalid object."""
    schema = crd_schemas()[(obj["apiVersion"], obj["kind"])]
    jsonschema.Draft7Validator(schema).validate(obj)
