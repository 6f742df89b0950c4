#!/usr/bin/env python3
"""Checks a megatrain checkpoint exported to Hugging Face (megatrain convert export) against megatrain.

Two subcommands (benchmarks/hf_export_gpu_check.sh runs both):

  make-batch: the last N*T+1 tokens of a preprocessed .bin (the tail of the corpus: the validation
    split's documents) written as an indexed dataset holding one document. megatrain, trained for
    one step at lr 0 on it with global_batch_size N and split [100,0,0], sees exactly these N
    windows tokens[i*T : i*T+T+1] (one epoch of (N*T+1-1)/T = N samples, in some order), so its
    iteration-1 loss is the mean cross-entropy over the same N*T predictions that `check` computes.
    Pure Python (no numpy) so that it also runs on a machine without it.

  check: loads the export with transformers' AutoModelForCausalLM (bf16 and fp32), computes the mean
    cross-entropy on that batch and a greedy continuation of a prompt (argmax over the tokenizer's
    ids, stopping at the end-of-document token, as `megatrain generate --temperature 0` does), and
    compares them with megatrain's loss and megatrain generate's text. Prints a table; exit 1 on a
    loss off by more than --tol (relative) for the bf16 model.
"""
import argparse
import array
import json
import os
import struct
import sys


def make_batch(args):
    tokens = array.array("H")
    size = os.path.getsize(args.bin)
    need = args.seqs * args.seq_len + 1
    if size < 2 * need:
        sys.exit(f"{args.bin}: {size // 2} tokens, fewer than {need}")
    with open(args.bin, "rb") as f:
        f.seek(size - 2 * need)
        tokens.frombytes(f.read(2 * need))
    with open(args.out + ".bin", "wb") as f:
        tokens.tofile(f)
    # Megatron's .idx: magic, version 1, dtype code 8 (uint16), 1 sequence, 2 document-index entries,
    # sizes (int32), pointers (int64, bytes), document index (int64).
    with open(args.out + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<QBQQ", 1, 8, 1, 2))
        f.write(struct.pack("<i", need))
        f.write(struct.pack("<q", 0))
        f.write(struct.pack("<qq", 0, 1))
    print(f"make-batch: {need} tokens ({args.seqs} x {args.seq_len} + 1) from the end of {args.bin} -> {args.out}.bin/.idx")


def byte_level_tokenizer(vocab, merges):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE.from_file(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def check(args):
    import torch
    from transformers import AutoModelForCausalLM

    with open(args.batch + ".bin", "rb") as f:
        raw = array.array("H")
        raw.frombytes(f.read())
    N, T = args.seqs, args.seq_len
    assert len(raw) == N * T + 1, (len(raw), N, T)
    flat = torch.tensor(list(raw), dtype=torch.long)
    inputs = torch.stack([flat[i * T:(i + 1) * T] for i in range(N)]).cuda()
    labels = torch.stack([flat[i * T + 1:(i + 1) * T + 1] for i in range(N)]).cuda()

    tok = byte_level_tokenizer(args.vocab_file, args.merge_file)
    prompt_ids = tok.encode(args.prompt).ids
    eod, nvocab = 50256, tok.get_vocab_size()
    mt_text = open(args.megatrain_text, encoding="utf-8").read()
    if mt_text.endswith("\n"):
        mt_text = mt_text[:-1]
    mt_cont = mt_text[len(args.prompt):] if mt_text.startswith(args.prompt) else None

    rows, result = [], {"megatrain_loss": args.megatrain_loss, "seqs": N, "seq_len": T, "prompt": args.prompt,
                        "megatrain_continuation": mt_cont}
    ok = True
    for name, dtype, folder in (("bf16", torch.bfloat16, args.hf_dir_bf16 or args.hf_dir),
                                ("fp32", torch.float32, args.hf_dir)):
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).cuda().eval()
        print(f"loaded {type(model).__name__} from {folder} as {name}")
        with torch.no_grad():
            losses = []
            for i in range(0, N, 4):  # a few sequences at a time: the logits are N x T x 50304 floats
                logits = model(input_ids=inputs[i:i + 4]).logits.float()
                losses.append(torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.size(-1)), labels[i:i + 4].reshape(-1), reduction="sum"))
            loss = (torch.stack(losses).sum() / (N * T)).item()
            ids = list(prompt_ids)
            for _ in range(args.max_new_tokens):
                last = model(input_ids=torch.tensor([ids[-model.config.max_position_embeddings:]]).cuda()).logits[0, -1]
                nxt = int(last[:nvocab].float().argmax())
                if nxt == eod:
                    break
                ids.append(nxt)
        cont = tok.decode(ids[len(prompt_ids):])
        rel = abs(loss - args.megatrain_loss) / args.megatrain_loss
        same = cont == mt_cont
        if name == "bf16" and rel > args.tol:
            ok = False
        rows.append((name, loss, rel, same))
        result[name] = {"loss": loss, "rel_diff": rel, "continuation": cont, "same_continuation": same}
        del model
        torch.cuda.empty_cache()

    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(f"\nbatch: {N} x {T} tokens (the last {N * T + 1} of the corpus); prompt {args.prompt!r}")
    print(f"megatrain continuation: {mt_cont!r}")
    for name, loss, rel, same in rows:
        print(f"transformers {name} continuation: {result[name]['continuation']!r}")
    print(f"\n| model | loss | vs megatrain {args.megatrain_loss:.5f} | same greedy text |")
    print("|---|---|---|---|")
    for name, loss, rel, same in rows:
        print(f"| transformers {name} | {loss:.5f} | {100 * rel:.3f}% | {same} |")
    print(f"\n{'PASS' if ok else 'FAIL'}: bf16 loss within {100 * args.tol:.1f}% of megatrain's")
    return 0 if ok else 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make-batch")
    m.add_argument("--bin", required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--seqs", type=int, default=16)
    m.add_argument("--seq-len", type=int, default=256)
    c = sub.add_parser("check")
    c.add_argument("--hf-dir", required=True, help="the export loaded as fp32")
    c.add_argument("--hf-dir-bf16", help="the export loaded as bf16 (default --hf-dir)")
    c.add_argument("--batch", required=True)
    c.add_argument("--seqs", type=int, default=16)
    c.add_argument("--seq-len", type=int, default=256)
    c.add_argument("--megatrain-loss", type=float, required=True)
    c.add_argument("--megatrain-text", required=True, help="file holding megatrain generate's stdout")
    c.add_argument("--prompt", required=True)
    c.add_argument("--max-new-tokens", type=int, default=40)
    c.add_argument("--vocab-file", default="data/tokenizers/gpt2/encoder.json")
    c.add_argument("--merge-file", default="data/tokenizers/gpt2/vocab.bpe")
    c.add_argument("--tol", type=float, default=0.01)
    c.add_argument("--json")
    args = p.parse_args()
    if args.cmd == "make-batch":
        make_batch(args)
        return 0
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
