"""What the drafter families share, owned by none of them: the KV caches (cache.py), the chain
drawn off a drafter's logits and the chunk mask (chain.py), the mask slots' token (mask.py) and the
draft-cost probe of a family that drafts a round in one forward (probe.py). Family packages import
from here, never from each other's internals for these."""
