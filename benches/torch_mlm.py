#!/usr/bin/env python3
"""PyTorch training the model of an `xfmr train --task mlm` run (the BERT-like masked language
model of the corpus's English side) on the same batches, in the same order, with the same masks,
for same-minutes comparisons: masked-token accuracy and perplexity on the validation split,
scored on exactly the masks xfmr scores.

It reads the xfmr run directory's `train-config.json` (the model, the masking probabilities and
special ids, label smoothing, batch size, schedule, Adam, seed, validation and checkpoint
cadence) and `tokenizer.json` (the same BPE vocabulary with its mask token), and the corpus
directory's `train.tsv` and `valid.tsv` (the target, English, column):

    target/release/xfmr train --task mlm --minutes 10 --out runs/mlm-10
    /work/torch-venv/bin/python benches/torch_mlm.py --run runs/mlm-10 --minutes 10

Before training it checks itself against the run's metrics log (`metrics.jsonl` or `.csv`,
when present): for the first `--check-steps` (200) logged training steps, the tokens xfmr read
(framed inputs plus masked targets) must equal the ones this script computes for that step (the
same batch and the same masks; it exits otherwise), and xfmr's validation accuracies
(correct / masked tokens) must have this script's count of masked validation tokens as a
denominator. xfmr logs no validation token count, so the second check is the reduced
denominators' least common multiple: it names the count exactly once an accuracy is a fraction
in lowest terms. It also prints xfmr's own figures from
the log (steps, tokens/s, the last validation) beside them.

What is the same as xfmr's run:
- the data: `train.tsv` and `valid.tsv` read as `xfmr_translate::data::parse_tsv` reads them (blank
  lines skipped, both sides trimmed), the English column encoded without special tokens, and
  sentences of more than `--max-len` tokens (default: the model's position table less the two
  framing tokens, at most 100, as `xfmr train --max-len` makes it) left out of both splits;
- BERT's masking (`xfmr_train::objective::mask_tokens`, bit for bit): SplitMix64 uniforms
  `(x >> 11) / 2^53`, each position chosen with `mask_prob`, one position drawn when none was,
  80 % mask id / 10 % random id in `first_regular_id..vocab` (a draw equal to the mask id keeps
  the token) / 10 % kept; the example's draw `draw(seed, step, index)` with the 0-based number
  of steps already taken and the example's index in the training set, and for validation
  `VALIDATION_STEP = u64::MAX` with its index in the validation set (so both models are scored
  on the same masks); inputs framed `[bos] input [eos]`, targets the original tokens at the
  chosen positions only, padding elsewhere;
- the batches: `token_batches` over the objective's lengths (`len + 2` both sides), or the
  length ladder's batches when the run has one (`xfmr train --length-ladder`, on for GPU
  backends), each epoch in the order `shuffled(batches, seed, epoch)`, `accumulate`
  micro-batches per step weighted by their share of the step's predicted tokens;
- the model (`xfmr_models::EncoderOnly` with its MLM head, as configured): token embedding
  (scaled by √d_model only if `scale_embeddings`), learned or sinusoidal positions, segment 0's
  embedding when there is a segment table, LayerNorm (or RMSNorm) of the embedding sum,
  dropout; pre- or post-norm layers (self-attention with a key padding mask, right padding,
  dropout on the attention weights; GELU/ReLU/SwiGLU feed-forward with its inner dropout;
  residual dropout), a final norm for pre-norm stacks; the head
  `Norm(exact GELU(W h + b)) Eᵀ + b_vocab` tied to the token embedding, computed at every
  position as HF's `BertForMaskedLM` does (xfmr's `MaskedLm` computes it at the chosen
  positions only, as google-research/bert does; `--gather` does the same here); the same
  initial distributions (normal 0.02 embeddings, positions and head; q, k, v Xavier-uniform
  with the packed `[d, 3d]` matrix's fans and zero biases, the attention's output and the
  feed-forward as `nn.Linear` draws them, the output's bias zero);
- the loss: label-smoothed cross-entropy (ε from the run, BERT's 0 by default) with padding out
  of the average and out of the smoothing mass (`SmoothingMass::NonPadding`);
- the optimiser: Adam (β₁, β₂, ε from the run; burn's bias-corrected update is PyTorch's), no
  weight decay and no clipping, the Noam schedule
  `factor · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)` of the 1-based step, or
  `--decay linear` (`xfmr_train::Decay::Linear`) when the run has it;
- the budget as `Trainer::run` counts it: wall-clock from the start of training, checked before
  every step, validations every `eval_every` steps and checkpoints every `checkpoint_every`
  (`torch.save` of the model and Adam into a temporary directory, the last `keep_checkpoints`
  kept) inside it, and a validation (and checkpoint) after the last step when it was not one;
- the validation metrics (`evaluate_loss`, `EvalLoss`): dropout off, batched as training is,
  mean NLL over the masked tokens, perplexity `exp(nll)`, accuracy = argmax equal to the
  original token over the masked positions.

What differs: PyTorch's own initial draws, dropout masks and kernels (the same distributions,
not the same numbers; f32 both sides); xfmr on a CPU backend trains data-parallel, one replica
per core, each on its share of every batch's rows with the gradients summed (the same step
mathematically), where this script runs one process with `--threads` intra-op threads; batches
are padded to their longest row even on a ladder (the ladder's filler rows and extra padding
change nothing but the shape); the final model is not averaged (xfmr averages its last
`average` checkpoints into `model/` after the budget, but its reported validations, like these,
are of the model as trained); nothing of the end of `xfmr train` (its filled-in test sentences,
the loss curve) is done.

Tokens per second are counted as xfmr's metrics log counts a step's `tokens`
(`StepReport::input_tokens + target_tokens`): the framed input tokens of every example
(`len + 2`, no padding) plus the masked tokens predicted, over the budget's clock (validations
and checkpoints included, as xfmr's 10-second windows include them). Every line printed is
JSON: one per validation (`step`, `train_s` on the budget's clock, `valid_nll`, `valid_ppl`,
`valid_accuracy`, `tokens`: the masked validation tokens scored), and last one with
`"final": true` (`steps`, `epochs`, `train_s` when the last step ended, `wall_s` with the final
validation and checkpoint as `RunSummary::elapsed` counts them, `tokens_per_s` over `train_s`,
and the last validation's `valid_ppl`, `valid_accuracy` and `valid_tokens`).
"""
import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from fractions import Fraction

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_pytorch import (  # noqa: E402  (ported)
    SplitMix64, model_positions, shuffled, token_batches)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
M64 = (1 << 64) - 1
# `xfmr_train::trainer::batch::VALIDATION_STEP`: the step validation draws with.
VALIDATION_STEP = M64


def emit(obj):
    print(json.dumps(obj), flush=True)


def read_english(path):
    """The target column of a `source<TAB>target` file, as `xfmr_translate::data::parse_tsv` reads
    it: a byte-order mark skipped, `\\r\\n` accepted, blank lines skipped, both sides trimmed,
    exactly one tab and no empty side."""
    out = []
    with open(path, "rb") as f:
        data = f.read()
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    for n, raw in enumerate(data.split(b"\n"), 1):
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        if not raw:
            continue
        fields = raw.decode("utf-8").split("\t")
        if len(fields) != 2 or not fields[0].strip() or not fields[1].strip():
            sys.exit(f"{path}:{n}: not `source<TAB>target` with both sides non-empty")
        out.append(fields[1].strip())
    return out


def draw(seed, step, index):
    """`xfmr_train::trainer::batch::draw`: the draw of example `index` at step `step`."""
    mixed = seed ^ ((step * 0x9E3779B97F4A7C15) & M64) ^ ((index * 0xC2B2AE3D27D4EB4F) & M64)
    return SplitMix64(mixed).next()


def mask_tokens(obj, tokens, seed):
    """`xfmr_train::objective::mask_tokens`, bit for bit: (input ids, chosen positions)."""
    rng = SplitMix64(seed)
    scale = float(1 << 53)

    def uniform():
        return (rng.next() >> 11) / scale

    p = obj["mask_prob"]
    chosen = [i for i in range(len(tokens)) if uniform() < p]
    if not chosen and tokens:
        chosen.append(min(int(uniform() * len(tokens)), len(tokens) - 1))
    out = list(tokens)
    first, mask_id = obj["first_regular_id"], obj["mask_id"]
    regular = max(obj["model"]["vocab_size"] - first, 0)
    replace, random = obj["replace_prob"], obj["random_prob"]
    for i in chosen:
        u = uniform()
        if u < replace:
            out[i] = mask_id
        elif u < replace + random and regular > 0:
            token = first + min(int(uniform() * regular), regular - 1)
            if token != mask_id:  # the mask token is never a random replacement
                out[i] = token
    return out, chosen


def ladder_batches(lengths, max_tokens, min_len, cap):
    """`xfmr_models::ladder::LengthLadder::batches`."""
    def rung_at(k):
        base = max(min_len, 1) << min(k // 2, 40)
        return base if k % 2 == 0 else (base * 3 + 1) // 2

    def rung(length):
        k = 0
        while rung_at(k) < length:
            k += 1
        r = rung_at(k)
        return max(min(r, cap) if cap is not None else r, length)

    rungs = [rung(max(a, b)) for a, b in lengths]
    order = sorted(range(len(lengths)),
                   key=lambda i: (rungs[i], lengths[i][1], lengths[i][0], i))
    batches, current = [], None
    for i in order:
        rows = max(max_tokens // max(rungs[i], 1), 1)
        if batches and current == (rungs[i], rows) and len(batches[-1]) < rows:
            batches[-1].append(i)
        else:
            batches.append([i])
            current = (rungs[i], rows)
    return batches


def build_model(torch, model_cfg, gather=False):
    """`xfmr_models::EncoderOnly` with its MLM head (see the module docs)."""
    nn, F = torch.nn, torch.nn.functional
    m, layer = model_cfg, model_cfg["layer"]
    d, heads, d_ff = layer["d_model"], layer["n_heads"], layer["d_ff"]
    positions = model_positions(m)
    if layer.get("n_kv_heads") not in (None, heads) or positions not in ("Learned", "Sinusoidal") \
            or not m["mlm_head"]:
        sys.exit("torch_mlm.py ports EncoderOnly with its MLM head, learned or sinusoidal "
                 "positions and full multi-head attention")
    pre = layer["norm_position"] == "Pre"
    bias, eps = layer["bias"], layer["norm_eps"]
    vocab = m["vocab_size"]

    def norm():
        if layer["norm"] == "RmsNorm":
            return nn.RMSNorm(d, eps=eps)
        return nn.LayerNorm(d, eps=eps)

    def packed_xavier(linear):
        """xfmr-attention's q, k and v: Xavier-uniform with the fans of the packed
        `[d, 3d]` matrix (PyTorch's `in_proj_weight`), zero bias."""
        a = math.sqrt(6.0 / (d + 3 * d))
        nn.init.uniform_(linear.weight, -a, a)
        if linear.bias is not None:
            nn.init.zeros_(linear.bias)
        return linear

    def normal(t):
        nn.init.normal_(t, std=0.02)
        return t

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = [packed_xavier(nn.Linear(d, d, bias=bias))
                                      for _ in range(3)]
            # The output projection: nn.Linear's weight, a zero bias (xfmr-attention).
            self.o = nn.Linear(d, d, bias=bias)
            if self.o.bias is not None:
                nn.init.zeros_(self.o.bias)
            # The feed-forward: nn.Linear's own draws (burn's LinearConfig default).
            self.ff1 = nn.Linear(d, d_ff, bias=bias)
            self.ff2 = nn.Linear(d_ff, d, bias=bias)
            self.gate = nn.Linear(d, d_ff, bias=bias) \
                if layer["activation"] == "SwiGlu" else None
            self.norm_attn, self.norm_ff = norm(), norm()
            self.drop = nn.Dropout(layer["dropout"])
            self.ffn_drop = nn.Dropout(layer["ffn_dropout"])

        def attention(self, x, keep):
            b, t, _ = x.shape

            def split(y):
                return y.view(b, t, heads, d // heads).transpose(1, 2)

            p = layer["attention_dropout"] if self.training else 0.0
            a = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)),
                                               split(self.v(x)), attn_mask=keep, dropout_p=p)
            return self.o(a.transpose(1, 2).reshape(b, t, d))

        def ffn(self, x):
            h = self.ff1(x)
            if self.gate is not None:
                h = F.silu(h) * self.gate(x)
            elif layer["activation"] == "Gelu":
                h = F.gelu(h)
            else:
                h = F.relu(h)
            return self.ff2(self.ffn_drop(h))

        def forward(self, x, keep):
            if pre:
                x = x + self.drop(self.attention(self.norm_attn(x), keep))
                return x + self.drop(self.ffn(self.norm_ff(x)))
            x = self.norm_attn(x + self.drop(self.attention(x, keep)))
            return self.norm_ff(x + self.drop(self.ffn(x)))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, d)  # no padding_idx: burn trains that row too
            normal(self.embed.weight)
            self.scale = math.sqrt(d) if m["scale_embeddings"] else 1.0
            if positions == "Learned":
                self.pos = nn.Parameter(normal(torch.empty(m["max_len"], d)))
            else:
                rows = max(m["max_len"], 1024)  # xfmr's sinusoids have no end
                table = torch.zeros(rows, d, dtype=torch.float64)
                pos = torch.arange(rows, dtype=torch.float64)[:, None]
                pair = torch.arange(0, d, 2, dtype=torch.float64)
                angle = pos / 10000.0 ** (pair / d)
                table[:, 0::2] = torch.sin(angle)
                table[:, 1::2] = torch.cos(angle)[:, : d // 2]
                self.register_buffer("pos", table.float())
            # Segment embeddings: every token in segment 0 (BERT's default), as xfmr reads them.
            self.types = nn.Parameter(normal(torch.empty(m["type_vocab_size"], d))) \
                if m["type_vocab_size"] > 0 else None
            self.embedding_norm = norm() if m["embedding_norm"] else None
            self.drop = nn.Dropout(layer["dropout"])
            self.layers = nn.ModuleList(Layer() for _ in range(m["n_layers"]))
            self.final_norm = norm() if pre else None
            self.dense = nn.Linear(d, d)
            normal(self.dense.weight)
            normal(self.dense.bias)
            self.head_norm = norm()
            self.head_bias = nn.Parameter(torch.zeros(vocab))

        def forward(self, ids, targets):
            """The logits and their targets: at every position (HF's `BertForMaskedLM`), or
            with `gather` at the chosen ones only (google-research/bert's `gather_indexes`, as
            xfmr's `MaskedLm` does)."""
            keep = (ids != m["pad_id"])[:, None, None, :]
            x = self.embed(ids) * self.scale + self.pos[: ids.shape[1]]
            if self.types is not None:
                x = x + self.types[0]
            if self.embedding_norm is not None:
                x = self.embedding_norm(x)
            x = self.drop(x)
            for lay in self.layers:
                x = lay(x, keep)
            if self.final_norm is not None:
                x = self.final_norm(x)
            if gather:
                chosen = targets != m["pad_id"]
                x, targets = x[chosen][None], targets[chosen][None]
            h = self.head_norm(F.gelu(self.dense(x)))
            return h @ self.embed.weight.T + self.head_bias, targets

    return Model()


def smoothed_loss(torch, logits, targets, pad, epsilon, count, correct=False):
    """xfmr's label-smoothed cross-entropy (`LabelSmoothedCrossEntropy`, its default
    `SmoothingMass::NonPadding`) over every position, as xfmr computes it: `1 - ε` on the
    target, `ε / (V - 2)` on every token that is neither the target nor padding; padding targets
    out of the mean (`count`: the non-padding targets). Returns the loss, the summed NLL and,
    with `correct`, how many targets the logits rank first."""
    vocab = logits.shape[-1]
    logits, y = logits.reshape(-1, vocab), targets.reshape(-1)
    real = (y != pad).to(logits.dtype)
    logp = torch.log_softmax(logits.float(), -1)
    nll = -logp.gather(1, y[:, None])[:, 0] * real
    if epsilon:
        others = (-logp.sum(-1) + logp[:, pad]) * real - nll
        loss = ((1.0 - epsilon) * nll + epsilon / (vocab - 2) * others).sum() / count
    else:
        loss = nll.sum() / count
    hits = int(((logits.argmax(-1) == y) & (y != pad)).sum()) if correct else None
    return loss, float(nll.detach().sum()), hits


def read_metrics(run):
    for name, kind in (("metrics.jsonl", "jsonl"), ("metrics.csv", "csv")):
        path = os.path.join(run, name)
        if not os.path.exists(path):
            continue
        records = []
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        header = lines[0].split(",") if kind == "csv" and lines else None
        for line in lines[1:] if header else lines:
            if not line:
                continue
            try:
                if header:
                    cells = dict(zip(header, line.split(",")))
                    r = {k: (v if k == "kind" else (float(v) if v not in ("", "NaN") else None))
                         for k, v in cells.items()}
                else:
                    r = json.loads(line)
            except ValueError:
                continue  # a torn last line
            records.append(r)
        return records
    return []


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", required=True,
                   help="the xfmr run directory (train-config.json, tokenizer.json)")
    p.add_argument("--data", default=os.path.join(ROOT, "crates/xfmr-cli/data/es-en"),
                   help="train.tsv and valid.tsv (default: xfmr train's embedded es-en set)")
    p.add_argument("--minutes", type=float,
                   help="wall-clock budget (default: the run's; 0: none)")
    p.add_argument("--steps", type=int, help="step budget (default: the run's)")
    p.add_argument("--max-len", type=int,
                   help="as `xfmr train --max-len` (default: the model's max_len - 2, "
                        "at most 100)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--gather", action="store_true",
                   help="the head at the chosen positions only, as xfmr's MaskedLm runs it "
                        "(default: every position, as HF's BertForMaskedLM)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--check-steps", type=int, default=200,
                   help="logged xfmr steps whose token counts are checked (0: none)")
    args = p.parse_args()
    import torch
    from tokenizers import Tokenizer
    torch.set_num_threads(args.threads)
    with open(os.path.join(args.run, "train-config.json")) as f:
        spec = json.load(f)
    if spec.get("task") != "mlm":
        sys.exit(f"{args.run}: not an mlm run")
    obj, train = spec["objective"], spec["train"]
    mcfg = obj["model"]
    pad, bos, eos = mcfg["pad_id"], obj["bos_id"], obj["eos_id"]
    seed = train["seed"]
    torch.manual_seed(seed)
    tok = Tokenizer.from_file(os.path.join(args.run, "tokenizer.json"))
    if tok.get_vocab_size(with_added_tokens=True) != mcfg["vocab_size"]:
        sys.exit("tokenizer.json's vocabulary is not the model's")
    learned = model_positions(mcfg) == "Learned"
    max_len = args.max_len or (min(100, mcfg["max_len"] - 2) if learned else 100)

    def sentences(name):
        texts = read_english(os.path.join(args.data, name))
        ids = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
        return [s for s in ids if len(s) <= max_len]

    examples, valid = sentences("train.tsv"), sentences("valid.tsv")
    if learned and any(len(s) + 2 > mcfg["max_len"] for s in examples + valid):
        sys.exit(f"--max-len {max_len}: sequences longer than the position table")

    lengths = lambda xs: [(len(s) + 2, len(s) + 2) for s in xs]  # noqa: E731
    ladder = train.get("ladder")

    def batches_of(xs):
        if ladder:
            return ladder_batches(lengths(xs), train["max_tokens"], ladder["min_len"],
                                  mcfg["max_len"] if learned else None)
        return token_batches(lengths(xs), train["max_tokens"])

    batches, valid_batches = batches_of(examples), batches_of(valid)
    accumulate = train.get("accumulate", 1)

    def framed(xs, indices, step):
        """The inputs and targets of examples `indices` at `step` (`MaskedLm::outputs`), the
        framed input tokens and the predicted ones."""
        inputs, targets, predicted = [], [], 0
        for i in indices:
            s = xs[i]
            masked, chosen = mask_tokens(obj, s, draw(seed, step, i))
            target = [pad] * (len(s) + 2)
            for c in chosen:
                target[c + 1] = s[c]
            inputs.append([bos] + masked + [eos])
            targets.append(target)
            predicted += len(chosen)
        return inputs, targets, sum(map(len, inputs)), predicted

    def tensor(rows):
        width = max(map(len, rows))
        return torch.tensor([r + [pad] * (width - len(r)) for r in rows], device=device)

    def batch_at(position):
        """The batch of the run's `position`-th micro-batch (0-based) and its epoch."""
        epoch, at = divmod(position, len(batches))
        return batches[orders(epoch)[at]], epoch

    cached_orders = {}

    def orders(epoch):
        if epoch not in cached_orders:
            cached_orders.clear()
            cached_orders[epoch] = shuffled(len(batches), seed, epoch)
        return cached_orders[epoch]

    # Validation masks are the same at every evaluation: drawn once.
    device = torch.device(args.device)
    valid_tensors = []
    for b in valid_batches:
        inputs, targets, _, n = framed(valid, b, VALIDATION_STEP)
        valid_tensors.append((tensor(inputs), tensor(targets), n))
    valid_tokens = sum(n for _, _, n in valid_tensors)

    # The check against xfmr's metrics log.
    records = read_metrics(args.run)
    check, xfmr = {}, {}
    train_records = [r for r in records if r.get("kind") == "train" and r.get("tokens")]
    logged = [r for r in train_records if r["step"] <= args.check_steps]
    if logged:
        bad = []
        for r in logged:
            step = int(r["step"])
            total = 0
            for k in range(accumulate):
                indices, _ = batch_at((step - 1) * accumulate + k)
                _, _, n_in, n = framed(examples, indices, step - 1)
                total += n_in + n
            if total != int(r["tokens"]):
                bad.append({"step": step, "xfmr": int(r["tokens"]), "ours": total})
        check.update(train_steps_checked=len(logged), train_tokens_match=not bad)
        if bad:
            emit({"check": check, "mismatches": bad[:5]})
            sys.exit("the tokens of xfmr's logged steps differ from this script's: not the "
                     "same batches or masks")
    denominator = 1
    for r in records:
        if r.get("kind") == "valid" and r.get("accuracy") is not None:
            q = Fraction(r["accuracy"]).limit_denominator(10 ** 9)
            denominator = math.lcm(denominator, q.denominator)
    if denominator > 1:
        check.update(valid_tokens=valid_tokens, xfmr_valid_tokens_multiple_of=denominator,
                     valid_tokens_match=valid_tokens % denominator == 0,
                     valid_tokens_exact=valid_tokens == denominator)
    if train_records:
        last = train_records[-1]
        xfmr.update(steps=int(last["step"]), elapsed_s=round(last["elapsed_s"], 2))
        if int(last["step"]) == len(train_records):  # one invocation, from step 1
            xfmr["tokens_per_s"] = round(sum(r["tokens"] for r in train_records)
                                         / last["elapsed_s"])
    valids = [r for r in records if r.get("kind") == "valid"]
    if valids:
        xfmr.update(valid_ppl=valids[-1]["perplexity"], valid_accuracy=valids[-1].get("accuracy"),
                    valid_step=int(valids[-1]["step"]))
    emit({"xfmr_check": check, "xfmr": xfmr})
    if check.get("valid_tokens_match") is False:
        sys.exit("xfmr's validation accuracies do not divide by this script's masked token count")

    model = build_model(torch, mcfg, args.gather).to(device)
    d = mcfg["layer"]["d_model"]
    optim = torch.optim.Adam(model.parameters(), lr=1.0,
                             betas=(train["beta_1"], train["beta_2"]), eps=train["epsilon"])
    factor, warmup = train["lr_factor"], train["warmup"]
    minutes = train.get("minutes") if args.minutes is None else (args.minutes or None)
    steps = args.steps or train["steps"]
    smoothing = obj["label_smoothing"]

    def learning_rate(step, spent_time):
        """`Trainer::learning_rate` of the 1-based `step`."""
        if train.get("decay") == "Linear":
            peak = factor / (math.sqrt(d) * math.sqrt(warmup))
            spent = max(step / steps, spent_time)
            return peak * max(min(step / warmup, 1.0 - spent), 0.0)
        return factor * d ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def validate():
        """`evaluate_loss`: dropout off, the whole validation split on the fixed masks."""
        model.eval()
        nll, count, correct = 0.0, 0, 0
        with torch.inference_mode():
            for ids, targets, n in valid_tensors:
                _, s, c = smoothed_loss(torch, *model(ids, targets), pad, smoothing, n, True)
                nll, count, correct = nll + s, count + n, correct + c
        model.train()
        return nll / count, count, correct / count

    emit({"examples": len(examples), "valid_examples": len(valid),
          "batches_per_epoch": len(batches), "valid_tokens": valid_tokens,
          "parameters": sum(t.numel() for t in model.parameters()),
          "torch": torch.__version__, "device": str(device),
          "threads": torch.get_num_threads()})
    saves = tempfile.mkdtemp(prefix="torch_mlm-")
    kept = []

    def checkpoint(step):
        """A checkpoint's cost inside the budget, as xfmr writes one (model and Adam)."""
        path = os.path.join(saves, f"step-{step:08d}.pt")
        torch.save({"model": model.state_dict(), "optim": optim.state_dict()}, path)
        kept.append(path)
        while len(kept) > max(train.get("keep_checkpoints", 1), 1):
            os.remove(kept.pop(0))

    step, tokens, position = 0, 0, 0
    evaluated = saved = False
    nll = count = accuracy = None
    model.train()
    started = time.perf_counter()
    elapsed = lambda: time.perf_counter() - started  # noqa: E731
    try:
        while step < steps:
            if minutes is not None and elapsed() >= 60 * minutes:
                break
            spent = min(max(elapsed() / (60 * minutes), 0.0), 1.0) if minutes else 0.0
            micro = []
            for _ in range(accumulate):
                indices, epoch = batch_at(position)
                position += 1
                inputs, targets, n_in, n = framed(examples, indices, step)
                micro.append((tensor(inputs), tensor(targets), n_in, n))
            total = sum(n for *_, n in micro)
            lr = learning_rate(step + 1, spent)
            for group in optim.param_groups:
                group["lr"] = lr
            optim.zero_grad(set_to_none=True)
            loss_sum = 0.0
            for ids, targets, n_in, n in micro:
                loss, _, _ = smoothed_loss(torch, *model(ids, targets), pad, smoothing, n)
                (loss * (n / total)).backward()
                loss_sum += float(loss.detach()) * n / total
                tokens += n_in + n
            optim.step()
            sync()
            step += 1
            if step % 50 == 0:
                emit({"step": step, "epoch": epoch, "loss": loss_sum, "lr": lr,
                      "elapsed_s": round(elapsed(), 2)})
            evaluated = step % train["eval_every"] == 0
            if evaluated:
                nll, count, accuracy = validate()
                emit({"step": step, "train_s": round(elapsed(), 2), "valid_nll": nll,
                      "valid_ppl": math.exp(nll), "valid_accuracy": accuracy, "tokens": count,
                      "train_tokens": tokens})
            saved = step % train["checkpoint_every"] == 0
            if saved:
                checkpoint(step)
        trained = elapsed()
        if step > 0:
            if not evaluated:
                nll, count, accuracy = validate()
                emit({"step": step, "train_s": round(elapsed(), 2), "valid_nll": nll,
                      "valid_ppl": math.exp(nll), "valid_accuracy": accuracy, "tokens": count,
                      "train_tokens": tokens})
            if not saved:
                checkpoint(step)
    finally:
        shutil.rmtree(saves, ignore_errors=True)
    wall = elapsed()
    emit({"final": True, "steps": step, "epochs": round(position / len(batches), 3),
          "wall_s": round(wall, 2), "train_s": round(trained, 2),
          "tokens_per_s": round(tokens / trained) if trained else None,
          "valid_nll": nll, "valid_ppl": math.exp(nll) if nll is not None else None,
          "valid_accuracy": accuracy, "valid_tokens": count})


if __name__ == "__main__":
    main()
