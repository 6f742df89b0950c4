#!/usr/bin/env python3
"""Writes PREFIX.bin/.idx (Megatron indexed dataset, uint16, one document): COUNT tokens drawn uniformly from
[0, VOCAB), the distribution torch_moe.py trains on (torch.randint), for megatrain runs on the same kind of data as
the reference (megatrain's data.mock is a learnable Markov chain instead).  usage: uniform_tokens.py PREFIX COUNT VOCAB [SEED]"""
import array, random, struct, sys

prefix, count, vocab = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
seed = int(sys.argv[4]) if len(sys.argv) > 4 else 0
assert vocab <= 65536
rng = random.Random(seed)
with open(prefix + ".bin", "wb") as f:
    array.array("H", (rng.randrange(vocab) for _ in range(count))).tofile(f)
with open(prefix + ".idx", "wb") as f:
    f.write(b"MMIDIDX\x00\x00")
    f.write(struct.pack("<QBQQ", 1, 8, 1, 2))  # version 1, dtype uint16, 1 sequence, 2 document indices
    f.write(struct.pack("<i", count))          # sequence lengths
    f.write(struct.pack("<q", 0))              # sequence pointers (bytes)
    f.write(struct.pack("<qq", 0, 1))          # document indices
