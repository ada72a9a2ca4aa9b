"""A fixed list of common English words for synthetic queries and product titles.

The words are short and frequent, so a BERT WordPiece tokenizer maps nearly every one to a single
token: a text of ``n`` words is about ``n`` tokens long, which lets the workloads control sequence
lengths without loading a tokenizer. Shipped in the package so benchmarks never download anything.
"""

from __future__ import annotations

_TEXT = """
the of and to in is for on with at by from as be this that it are or was an not but all
new more one two three four five ten big small best good great low high fast light dark
black white red blue green gray pink gold silver brown yellow orange purple clear soft hard
long short wide thin thick warm cold hot dry wet fresh clean free easy safe strong smart
home kitchen garden office car bike road sport game music book phone watch camera screen
light lamp table chair desk bed sofa door window wall floor room house water coffee tea milk
bread rice fruit apple orange lemon sugar salt oil box bag cup bottle glass plate bowl knife
shoe shirt dress coat jacket hat cap sock glove belt ring bracelet chain case cover card
paper pen pencil note map ticket gift toy doll ball kite puzzle brush soap towel cream hair
face hand foot eye skin body baby child kid man woman family friend team club school class
price sale deal offer buy sell shop store order pay cost cheap value quality brand model
size color style set pack pair kit part piece unit item type kind series line range plus
pro max mini lite air power energy battery charger cable wire port plug switch button
key lock tool drill saw hammer nail screw tape rope net tent boat fish bird dog cat horse
tree flower plant seed leaf grass rock sand snow rain wind sun moon star sky sea river lake
city town street park market travel trip hotel beach summer winter spring fall night day
week year time hour minute morning evening today first last next old young real true open
close start stop run walk play work read write cook clean wash fix build make take give
keep find show help need want like love use try look see hear feel call move turn hold
"""

# dict.fromkeys drops repeats while keeping the order, so sampling is uniform over distinct words.
WORDS: tuple[str, ...] = tuple(dict.fromkeys(_TEXT.split()))
