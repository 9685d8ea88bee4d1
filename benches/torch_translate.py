#!/usr/bin/env python3
"""PyTorch training the model of an `xfmr train` translation run on the same batches in the same
order, for time-to-quality comparisons (issue 41's time to test BLEU 40, issue 44's side by
side): the peer of `xfmr train`, one script away.

It reads the xfmr run directory's `train-config.json` (model widths, dropout, label smoothing,
batch size, schedule, Adam, seed, checkpoint averaging) and `tokenizer.json` (the same BPE
vocabulary and special ids), and the corpus directory's `train.tsv`, `valid.tsv` and `test.tsv`:

    xfmr train --backend cuda --preset small --vocab-size 8000 --warmup 800 \\
        --max-tokens 16000 --minutes 10 --test-sentences 500 --out runs/gpu
    python3 benches/torch_translate.py --run runs/gpu --data crates/xfmr-cli/data/es-en \\
        --device cuda --minutes 10 --bleu-every 500

What is the same as xfmr's run: the pairs (at most `--max-len` tokens a side), the framing
(source `ids + [eos]`, decoder input `[bos] + ids`, output `ids + [eos]`), the token-count
batches (`xfmr_train::data::token_batches`, ported) and their seeded order in each epoch
(`shuffled`, bit for bit), the paper's model (post-norm layers without a final norm, shared and
tied embeddings scaled by √d_model, sinusoidal positions, dropout on the embeddings, the
sub-layers, the attention weights and inside the feed-forward as the config says), the Noam
schedule (§5.3), Adam (β, ε), label smoothing, and the average of the last `average` checkpoints
(every `checkpoint_every` steps) as the final model. What differs: PyTorch's label smoothing
spreads ε over every class (xfmr's leaves out the padding class), its own initialisation and
random streams, batches padded to their longest sequence (not xfmr's GPU length ladder), and
greedy decoding only (up to source length + 50 tokens): compare with xfmr's greedy BLEU
(`results.json`). Training time excludes the evaluations; every line printed is JSON.
"""
import argparse
import copy
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_pytorch import shuffled, token_batches  # noqa: E402  (the ported batching)


def read_pairs(path, tok, max_len=None):
    pairs, refs = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            src, tgt = line.rstrip("\n").rstrip("\r").split("\t")
            s = tok.encode(src, add_special_tokens=False).ids
            t = tok.encode(tgt, add_special_tokens=False).ids
            if max_len is None or (len(s) <= max_len and len(t) <= max_len):
                pairs.append((s, t))
                refs.append(tgt)
    return pairs, refs


def build_model(torch, cfg, device):
    nn = torch.nn
    m, layer = cfg["model"], cfg["model"]["layer"]
    if layer["norm_position"] != "Post" or layer["positions"] != "Sinusoidal" \
            or not m["share_embeddings"] or not m["tie_output"] or layer.get("n_kv_heads"):
        sys.exit("torch_translate.py ports the paper's model only: post-norm, sinusoidal "
                 "positions, shared and tied embeddings, no grouped heads")
    d, vocab = layer["d_model"], m["src_vocab_size"]
    act = {"Relu": "relu", "Gelu": "gelu"}[layer["activation"]]
    # One dropout rate per nn layer: PyTorch's layers take one for the sub-layer outputs, the
    # attention weights and the feed-forward's inside alike.
    drop = layer["dropout"]
    if layer["attention_dropout"] != drop or layer["ffn_dropout"] != drop:
        print(json.dumps({"note": "attention/ffn dropout differ from dropout; PyTorch uses "
                                  f"{drop} for all"}), flush=True)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, d, padding_idx=m["pad_id"])
            enc = nn.TransformerEncoderLayer(d, layer["n_heads"], layer["d_ff"], drop, act,
                                             layer["norm_eps"], batch_first=True,
                                             bias=layer["bias"])
            dec = nn.TransformerDecoderLayer(d, layer["n_heads"], layer["d_ff"], drop, act,
                                             layer["norm_eps"], batch_first=True,
                                             bias=layer["bias"])
            self.encoder = nn.TransformerEncoder(enc, m["n_encoder_layers"],
                                                 enable_nested_tensor=False)
            self.decoder = nn.TransformerDecoder(dec, m["n_decoder_layers"])
            self.drop = nn.Dropout(drop)
            pos = torch.arange(m["max_len"]).unsqueeze(1)
            div = torch.exp(torch.arange(0, d, 2) * (-math.log(10000.0) / d))
            table = torch.zeros(m["max_len"], d)
            table[:, 0::2], table[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
            self.register_buffer("table", table)
            nn.init.normal_(self.embed.weight, std=d ** -0.5)

        def inputs(self, ids):
            return self.drop(self.embed(ids) * math.sqrt(d) + self.table[: ids.shape[1]])

        def encode(self, src):
            pad = src == m["pad_id"]
            return self.encoder(self.inputs(src), src_key_padding_mask=pad), pad

        def decode(self, memory, src_pad, tgt_in):
            causal = nn.Transformer.generate_square_subsequent_mask(tgt_in.shape[1],
                                                                    device=tgt_in.device)
            h = self.decoder(self.inputs(tgt_in), memory, tgt_mask=causal, tgt_is_causal=True,
                             tgt_key_padding_mask=tgt_in == m["pad_id"],
                             memory_key_padding_mask=src_pad)
            return h @ self.embed.weight.T

        def forward(self, src, tgt_in):
            memory, src_pad = self.encode(src)
            return self.decode(memory, src_pad, tgt_in)

    return Model().to(device)


def greedy_bleu(torch, model, tok, pairs, refs, ids, device, batch=64):
    import sacrebleu
    pad, bos, eos = ids
    model.eval()
    hyps = []
    with torch.inference_mode():
        for i in range(0, len(pairs), batch):
            rows = [s + [eos] for s, _ in pairs[i:i + batch]]
            width = max(map(len, rows))
            src = torch.tensor([r + [pad] * (width - len(r)) for r in rows], device=device)
            memory, src_pad = model.encode(src)
            out = torch.full((len(rows), 1), bos, device=device)
            done = torch.zeros(len(rows), dtype=torch.bool, device=device)
            for _ in range(width + 50):
                nxt = model.decode(memory, src_pad, out)[:, -1].argmax(-1)
                nxt = torch.where(done, torch.full_like(nxt, pad), nxt)
                out = torch.cat([out, nxt[:, None]], 1)
                done |= nxt == eos
                if bool(done.all()):
                    break
            for row in out[:, 1:].tolist():
                row = row[:row.index(eos)] if eos in row else row
                hyps.append(tok.decode([t for t in row if t != pad]))
    model.train()
    return sacrebleu.corpus_bleu(hyps, [refs]).score, hyps


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", required=True, help="the xfmr run directory (config, tokenizer)")
    p.add_argument("--data", required=True, help="train.tsv, valid.tsv, test.tsv")
    p.add_argument("--device", default="cuda")
    p.add_argument("--minutes", type=float, help="training time budget (default: the run's)")
    p.add_argument("--steps", type=int, help="step budget (default: the run's)")
    p.add_argument("--max-len", type=int, default=100, help="as `xfmr train --max-len`")
    p.add_argument("--bleu-every", type=int, default=0,
                   help="greedy test BLEU every this many steps as well as at the end")
    p.add_argument("--test-sentences", type=int, default=500)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", help="write the final model's test translations here")
    args = p.parse_args()
    import torch
    from tokenizers import Tokenizer
    torch.set_num_threads(args.threads)
    with open(os.path.join(args.run, "train-config.json")) as f:
        spec = json.load(f)
    if spec.get("task") != "translation":
        sys.exit(f"{args.run}: not a translation run")
    cfg, train = spec["objective"], spec["train"]
    if train.get("decay") or train.get("accumulate", 1) != 1:
        sys.exit("torch_translate.py ports the paper's schedule without decay or accumulation")
    torch.manual_seed(train["seed"])
    tok = Tokenizer.from_file(os.path.join(args.run, "tokenizer.json"))
    pad, bos, eos = cfg["model"]["pad_id"], cfg["bos_id"], cfg["eos_id"]
    pairs, _ = read_pairs(os.path.join(args.data, "train.tsv"), tok, args.max_len)
    test, refs = read_pairs(os.path.join(args.data, "test.tsv"), tok)
    test, refs = test[:args.test_sentences], refs[:args.test_sentences]
    batches = token_batches([(len(s) + 1, len(t) + 1) for s, t in pairs], train["max_tokens"])
    device = torch.device(args.device)
    model = build_model(torch, cfg, device)
    d = cfg["model"]["layer"]["d_model"]
    optim = torch.optim.Adam(model.parameters(), lr=1.0,
                             betas=(train["beta_1"], train["beta_2"]), eps=train["epsilon"])
    factor, warmup = train["lr_factor"], train["warmup"]
    minutes = args.minutes if args.minutes is not None else train.get("minutes")
    steps = args.steps or min(train["steps"], 10 ** 9)
    smoothing = cfg["label_smoothing"]
    vocab = cfg["model"]["tgt_vocab_size"]

    def tensor(rows, width):
        return torch.tensor([r + [pad] * (width - len(r)) for r in rows], device=device)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    kept, trained, step, epoch, order = [], 0.0, 0, 0, shuffled(len(batches), train["seed"], 0)
    print(json.dumps({"pairs": len(pairs), "batches_per_epoch": len(batches),
                      "torch": torch.__version__, "device": str(device)}), flush=True)
    position = 0
    while step < steps and (minutes is None or trained < 60 * minutes):
        if position == len(order):
            epoch, position = epoch + 1, 0
            order = shuffled(len(batches), train["seed"], epoch)
        rows = [pairs[i] for i in batches[order[position]]]
        position += 1
        step += 1
        start = time.perf_counter()
        src = tensor([s + [eos] for s, _ in rows], max(len(s) + 1 for s, _ in rows))
        width = max(len(t) + 1 for _, t in rows)
        tgt_in, tgt_out = tensor([[bos] + t for _, t in rows], width), \
            tensor([t + [eos] for _, t in rows], width)
        lr = factor * d ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)
        for group in optim.param_groups:
            group["lr"] = lr
        logits = model(src, tgt_in)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), tgt_out.reshape(-1),
                                                 ignore_index=pad, label_smoothing=smoothing)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        sync()
        trained += time.perf_counter() - start
        if step % 50 == 0:
            print(json.dumps({"step": step, "epoch": epoch, "loss": loss.item(), "lr": lr,
                              "train_s": round(trained, 2)}), flush=True)
        if step % train["checkpoint_every"] == 0:
            kept = (kept + [copy.deepcopy(model.state_dict())])[-train["average"]:]
        if args.bleu_every and step % args.bleu_every == 0:
            bleu, _ = greedy_bleu(torch, model, tok, test, refs, (pad, bos, eos), device)
            print(json.dumps({"step": step, "train_s": round(trained, 2),
                              "test_bleu_greedy": round(bleu, 2)}), flush=True)
    if step % train["checkpoint_every"] != 0:
        kept = (kept + [copy.deepcopy(model.state_dict())])[-train["average"]:]
    # The final model: the average of the last checkpoints (paper §6.1), as xfmr's.
    averaged = {k: sum(s[k].float() for s in kept) / len(kept) for k in kept[0]}
    model.load_state_dict({k: v.to(kept[0][k].dtype) for k, v in averaged.items()})
    bleu, hyps = greedy_bleu(torch, model, tok, test, refs, (pad, bos, eos), device)
    print(json.dumps({"final": True, "steps": step, "epochs": epoch + position / len(order),
                      "train_s": round(trained, 2), "averaged": len(kept),
                      "test_bleu_greedy": round(bleu, 2), "test_sentences": len(test)}),
          flush=True)
    if args.out:
        tmp = args.out + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("\n".join(hyps) + "\n")
        os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
