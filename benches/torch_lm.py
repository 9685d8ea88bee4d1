#!/usr/bin/env python3
"""PyTorch training the model of an `xfmr train --task lm` run (the GPT-like causal language
model of the English side of the Spanish-English TSV corpus) on the same batches in the same
order under the same wall-clock budget: the peer of `xfmr train --task lm` for a side-by-side
"same minutes, same machine, compare validation perplexity" benchmark.

It reads the xfmr run directory's `train-config.json` (the model, label smoothing, batch size,
length ladder, accumulation, schedule, Adam, seed, validation and checkpoint cadence, budget)
and `tokenizer.json` (the same BPE vocabulary and special ids), and the corpus directory's
`train.tsv` and `valid.tsv` (default: `crates/xfmr-cli/data/es-en`, the set `xfmr train`
embeds). Run xfmr first (into a new run directory: an existing one is resumed), then this
script on its run directory, one after the other on the same otherwise idle machine, with as
many `--threads` as xfmr had cores (it runs one data-parallel replica per core):

    target/release/xfmr train --task lm --minutes 10 --test-sentences 0 --out runs/en-lm-10
    /work/torch-venv/bin/python benches/torch_lm.py --run runs/en-lm-10 --minutes 10

Every line printed is one JSON object: a validation line `{"step", "train_s", "valid_nll",
"valid_ppl", "valid_accuracy", "valid_tokens", "tokens"}` every `eval_every` steps (`train_s`:
seconds since training started, xfmr's `elapsed_s`; `tokens`: tokens trained so far, counted
as xfmr's metrics count them, below; `valid_accuracy`: xfmr's token accuracy), and a `"step":
0` one before the clock starts (the untrained model: its perplexity is about the vocabulary
size times e^0.5, logits of unit variance, and its loss xfmr's first step's); a training line
`{"step", "epoch", "loss", "lr", "tokens", "train_s"}` every `--log-every` steps (with
`--log-every 1` its per-step `tokens` equal the `tokens` of xfmr's `train` records: the same
batches in the same order); and last `{"final": true, "steps", "stop", "train_s", "wall_s",
"tokens_per_s", "target_tokens_per_s", "target_tokens", "valid_ppl", "valid_nll",
"valid_accuracy", "valid_tokens"}`. Compare `valid_ppl` with the `perplexity` of the last
`valid` record of xfmr's `metrics.jsonl`; `valid_tokens` is the count of predicted
validation tokens, the `EvalLoss::tokens` xfmr divides by (its records hold `accuracy`,
correct / tokens, but not the count).

What is the same as xfmr's run:
- the examples: the target (second) column of `train.tsv`/`valid.tsv` as `xfmr_translate::data`
  parses it (BOM skipped, blank lines skipped, `\\r` and surrounding whitespace trimmed),
  encoded without special tokens, sentences of more than `--max-len` (default 100, as
  `xfmr train --max-len`) tokens left out of training and of validation alike;
- the framing (`objective/lm.rs`): the model reads `[bos] ids` and predicts `ids [eos]`, both
  `len + 1` tokens; right padding, which causal attention keeps out of the real positions;
- the batches: `xfmr_train::data::token_batches` over the objective's lengths, or the
  `LengthLadder`'s batches and padded shapes (filler rows reading `[bos]` and predicting
  nothing) when the config has a ladder (xfmr's GPU runs), ported, and each epoch's seeded
  order (`shuffled`, bit for bit); validation batched the same way (`evaluate_loss`);
- the loss: xfmr-models' label-smoothed cross-entropy (`SmoothingMass::NonPadding`: `1 - eps`
  on the target, `eps / (V - 2)` on every other token that is not padding, padding out of
  the mean), the plain NLL when eps is 0 (the lm preset's); accumulated micro-batches weighted
  by their share of the step's predicted tokens;
- the model (`DecoderOnly` as configured): token embedding (x sqrt(d_model) if
  `scale_embeddings`), learned (or sinusoidal) positions added, dropout on the sum, `n_layers`
  self-attention layers under a causal mask, pre-norm `x + Dropout(f(Norm(x)))` or post-norm
  `Norm(x + Dropout(f(x)))`, a final norm for pre-norm stacks, LayerNorm or RMSNorm with the
  config's eps, exact GELU/ReLU/SwiGLU feed-forward, attention and feed-forward dropouts where
  the config puts them, biases as configured, output tied to the embedding (or a linear
  layer); xfmr's initialisers (embedding N(0, d^-1/2), learned positions N(0, 0.02), q, k, v
  Xavier-uniform with the packed `[d, 3d]` matrix's fans, the attention's output and the
  feed-forward as `nn.Linear` draws them, attention biases 0, norms 1 and 0);
- the optimiser: Adam (beta_1, beta_2, eps of the config; no weight decay, no gradient
  clipping, as burn's `AdamConfig` there), the learning rate set per step from the warm-up /
  inverse-square-root schedule `factor * d_model^-0.5 * min(step^-0.5, step *
  warmup^-1.5)` (burn's Noam), or `decay: linear` (`trainer/optim.rs`);
- the budget (`trainer/run.rs`): wall-clock from the start of training, the validations every
  `eval_every` steps and the checkpoints every `checkpoint_every` steps (model and Adam state
  written to disk, the newest `keep_checkpoints` kept) inside it, checked before every step;
  after it, one more validation unless the last step had one: its perplexity is the run's
  (xfmr's last `valid` record in `metrics.jsonl`, its `perplexity`).
- tokens/s: `tokens_per_s` counts what xfmr's progress bar and `metrics.jsonl` count, the
  input tokens read plus the tokens predicted (for the lm both `len + 1` a sentence, so twice
  the predicted tokens), over the training loop's wall-clock (validations and checkpoints
  included, as xfmr's ~10 s windows include them); xfmr's figure for the whole run is the sum
  of `tokens` of its `train` records over the last one's `elapsed_s`. `target_tokens_per_s`
  is the predicted tokens alone over the same seconds.

What differs: PyTorch's own random streams (initial weights drawn from the same
distributions, other dropout masks), its kernels (`scaled_dot_product_attention`, fused
cross-entropy) and float rounding; one process with `--threads` intra-op threads where
`xfmr train` on the CPU runs one data-parallel replica per core (the same batches, the
gradients summed: the same steps, but not the same dropout masks); no final model (xfmr
averages its last `average` checkpoints after the budget and reports nothing measured on the
average for the lm, so nothing here is left out of the comparison); `torch.save` checkpoints,
not xfmr's record files with their manifest. RoPE, ALiBi and grouped key/value heads are not
ported: such a config is refused, naming the field.
"""
import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from compare_pytorch import model_positions, shuffled, token_batches  # noqa: E402  (ported)

DATA = os.path.join(os.path.dirname(HERE), "crates", "xfmr-cli", "data", "es-en")


def read_sentences(path, tok, max_len):
    """The target side of a TSV file as `xfmr_translate::data::parse_tsv` reads it, encoded as
    `SubwordTokenizer::encode` does (no special tokens), at most `max_len` tokens."""
    with open(path, "rb") as f:
        data = f.read()
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    texts = []
    for number, raw in enumerate(data.split(b"\n"), 1):
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        if not raw:
            continue
        fields = raw.decode("utf-8").split("\t")
        if len(fields) != 2 or not fields[0].strip() or not fields[1].strip():
            sys.exit(f"{path}:{number}: not `source<TAB>target` (xfmr refuses it too)")
        texts.append(fields[1].strip())
    ids = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    return [s for s in ids if len(s) <= max_len]


def ladder_rung(ladder, length, cap):
    """`LengthLadder::rung`: the smallest rung `min_len * 2^(k/2)` (x 1.5 for odd k) that holds
    `length`, at most `cap`, never below `length`."""
    base, k = max(ladder["min_len"], 1), 0
    while True:
        rung = base << (k // 2)
        if k % 2:
            rung = (rung * 3 + 1) // 2
        if rung >= length:
            break
        k += 1
    if cap is not None:
        rung = min(rung, cap)
    return max(rung, length)


def ladder_batches(ladder, lengths, max_tokens, cap):
    """`LengthLadder::batches`: examples by rung, sorted by length, cut into full rows."""
    rung = [ladder_rung(ladder, max(a, b), cap) for a, b in lengths]
    order = sorted(range(len(lengths)), key=lambda i: (rung[i], lengths[i][1], lengths[i][0], i))
    batches, current = [], None
    for i in order:
        rows = max(max_tokens // max(rung[i], 1), 1)
        if batches and current == (rung[i], rows) and len(batches[-1]) < rows:
            batches[-1].append(i)
        else:
            batches.append([i])
            current = (rung[i], rows)
    return batches


def check_portable(m):
    """Exits naming the first model option this script does not port."""
    layer = m["layer"]
    problems = []
    positions = model_positions(m)
    if not isinstance(positions, str) or positions not in ("Learned", "Sinusoidal", "None"):
        problems.append(f"positions {json.dumps(positions)} (RoPE and ALiBi are not ported)")
    if layer.get("n_kv_heads") not in (None, layer["n_heads"]):
        problems.append(f"layer.n_kv_heads {layer['n_kv_heads']} (grouped heads)")
    if layer["activation"] not in ("Relu", "Gelu", "SwiGlu"):
        problems.append(f"layer.activation {layer['activation']}")
    if layer["norm"] not in ("LayerNorm", "RmsNorm"):
        problems.append(f"layer.norm {layer['norm']}")
    if layer["norm_position"] not in ("Pre", "Post"):
        problems.append(f"layer.norm_position {layer['norm_position']}")
    if layer["d_model"] % layer["n_heads"]:
        problems.append("layer.d_model not a multiple of layer.n_heads")
    if problems:
        sys.exit("torch_lm.py cannot port this model: " + "; ".join(problems))


def sinusoidal_table(torch, length, d, base=10000.0):
    """`xfmr_position::sinusoidal_table`: column c of row p is sin (even c) or cos (odd c) of
    `p / base^(2 floor(c/2) / d)`, in float64, rounded to float32."""
    pos = torch.arange(length, dtype=torch.float64)[:, None]
    pair = (torch.arange(d) // 2).to(torch.float64)
    angle = pos / base ** (2.0 * pair / d)
    table = torch.where(torch.arange(d) % 2 == 0, torch.sin(angle), torch.cos(angle))
    return table.float()


def build_model(torch, m, device):
    nn, F = torch.nn, torch.nn.functional
    layer = m["layer"]
    d, heads, d_ff, bias = layer["d_model"], layer["n_heads"], layer["d_ff"], layer["bias"]
    vocab, pre = m["vocab_size"], layer["norm_position"] == "Pre"

    def attention_linear(packed):
        """xfmr-attention's projections, zero biases: q, k and v Xavier-uniform with the fans
        of the packed `[d, 3d]` matrix (PyTorch's `in_proj_weight`), the output as
        `nn.Linear` draws its weight."""
        lin = nn.Linear(d, d, bias=bias)
        if packed:
            a = math.sqrt(6.0 / (d + 3 * d))
            nn.init.uniform_(lin.weight, -a, a)
        if bias:
            nn.init.zeros_(lin.bias)
        return lin

    def norm():
        if layer["norm"] == "LayerNorm":
            return nn.LayerNorm(d, eps=layer["norm_eps"])
        return nn.RMSNorm(d, eps=layer["norm_eps"])

    class Block(nn.Module):
        """`SelfAttentionLayer` run causally: self-attention, then the feed-forward network,
        each a residual sub-layer with the residual dropout on its output."""

        def __init__(self):
            super().__init__()
            self.norm_attn, self.norm_ff = norm(), norm()
            self.query, self.key, self.value = (attention_linear(True) for _ in range(3))
            self.output = attention_linear(False)
            # The feed-forward: nn.Linear's own draws (burn's LinearConfig default).
            self.linear1 = nn.Linear(d, d_ff, bias=bias)
            self.linear2 = nn.Linear(d_ff, d, bias=bias)
            self.gate = nn.Linear(d, d_ff, bias=bias) if layer["activation"] == "SwiGlu" else None
            self.drop = nn.Dropout(layer["dropout"])
            self.ffn_drop = nn.Dropout(layer["ffn_dropout"])

        def attention(self, x):
            b, t, _ = x.shape
            split = lambda y: y.view(b, t, heads, d // heads).transpose(1, 2)  # noqa: E731
            q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
            p = layer["attention_dropout"] if self.training else 0.0
            a = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
            return self.output(a.transpose(1, 2).reshape(b, t, d))

        def ffn(self, x):
            h = self.linear1(x)
            if layer["activation"] == "Relu":
                h = F.relu(h)
            elif layer["activation"] == "Gelu":
                h = F.gelu(h)  # exact (erf) GELU, as xfmr's
            else:
                h = F.silu(h) * self.gate(x)
            return self.linear2(self.ffn_drop(h))

        def forward(self, x):
            if pre:
                x = x + self.drop(self.attention(self.norm_attn(x)))
                return x + self.drop(self.ffn(self.norm_ff(x)))
            x = self.norm_attn(x + self.drop(self.attention(x)))
            return self.norm_ff(x + self.drop(self.ffn(x)))

    class DecoderOnly(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            nn.init.normal_(self.embed.weight, std=d ** -0.5)
            self.scale = math.sqrt(d) if m["scale_embeddings"] else 1.0
            self.positions = positions = model_positions(m)
            self.learned = None
            if positions == "Learned":
                self.learned = nn.Parameter(torch.empty(m["max_len"], d))
                nn.init.normal_(self.learned, std=0.02)
            elif positions == "Sinusoidal":
                # xfmr precomputes 5000 rows and computes any further on the fly.
                self.register_buffer("sinusoids", sinusoidal_table(torch, 5000, d),
                                     persistent=False)
            self.drop = nn.Dropout(layer["dropout"])
            self.blocks = nn.ModuleList(Block() for _ in range(m["n_layers"]))
            self.final_norm = norm() if pre else None
            self.out = None if m["tie_output"] else nn.Linear(d, vocab)

        def forward(self, ids):
            t = ids.shape[1]
            x = self.embed(ids) * self.scale
            if self.learned is not None:
                x = x + self.learned[:t]
            elif self.positions == "Sinusoidal":
                table = self.sinusoids if t <= self.sinusoids.shape[0] else \
                    sinusoidal_table(torch, t, d).to(x.device)
                x = x + table[:t]
            x = self.drop(x)
            for block in self.blocks:
                x = block(x)
            if self.final_norm is not None:
                x = self.final_norm(x)
            return x @ self.embed.weight.T if self.out is None else self.out(x)

    return DecoderOnly().to(device)


def smoothed_loss(torch, logits, targets, pad, epsilon, count):
    """xfmr's `LabelSmoothedCrossEntropy` (`SmoothingMass::NonPadding`): `1 - eps` on the
    target and `eps / (V - 2)` on every token that is neither the target nor padding,
    padding positions out of the mean. `count` is the number of non-padding targets (known
    on the host). Returns the mean loss and the summed NLL (detached)."""
    F = torch.nn.functional
    vocab = logits.shape[-1]
    z = logits.reshape(-1, vocab).float()
    y = targets.reshape(-1)
    nll_sum = F.cross_entropy(z, y, ignore_index=pad, reduction="sum")
    if epsilon == 0.0:
        return nll_sum / count, nll_sum.detach()
    real = y != pad
    logp = torch.log_softmax(z[real], -1)
    target_lp = logp.gather(1, y[real][:, None])[:, 0]
    others = -(logp.sum(-1) - target_lp - logp[:, pad])
    loss = ((1.0 - epsilon) * -target_lp + epsilon / (vocab - 2) * others).sum() / count
    return loss, nll_sum.detach()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", required=True,
                   help="the xfmr run directory (train-config.json, tokenizer.json)")
    p.add_argument("--data", default=DATA, help="directory of train.tsv and valid.tsv "
                   "(default: the set xfmr train embeds)")
    p.add_argument("--minutes", type=float,
                   help="wall-clock budget from the start of training (default: the run's)")
    p.add_argument("--steps", type=int, help="step budget (default: the run's)")
    p.add_argument("--max-len", type=int, default=100, help="as `xfmr train --max-len`")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--device", default="cpu")
    p.add_argument("--log-every", type=int, default=50,
                   help="a training line every this many steps (0: none)")
    p.add_argument("--out", help="directory for the checkpoints (default: a temporary one, "
                   "removed at the end)")
    args = p.parse_args()
    import torch
    from tokenizers import Tokenizer
    torch.set_num_threads(args.threads)
    with open(os.path.join(args.run, "train-config.json")) as f:
        spec = json.load(f)
    if spec.get("task") != "lm":
        sys.exit(f"{args.run}: not an `xfmr train --task lm` run (task {spec.get('task')!r})")
    cfg, train = spec["objective"], spec["train"]
    m = cfg["model"]
    check_portable(m)
    pad, bos, eos = m["pad_id"], cfg["bos_id"], cfg["eos_id"]
    epsilon = cfg.get("label_smoothing", 0.0)
    torch.manual_seed(train["seed"])
    tok = Tokenizer.from_file(os.path.join(args.run, "tokenizer.json"))
    if tok.get_vocab_size() != m["vocab_size"]:
        sys.exit(f"tokenizer.json has {tok.get_vocab_size()} tokens, the model "
                 f"{m['vocab_size']}")
    examples = read_sentences(os.path.join(args.data, "train.tsv"), tok, args.max_len)
    valid = read_sentences(os.path.join(args.data, "valid.tsv"), tok, args.max_len)
    learned = model_positions(m) == "Learned"
    cap = m["max_len"] if learned else None  # `Objective::max_positions`
    if learned and any(len(s) + 1 > m["max_len"] for s in examples + valid):
        sys.exit(f"a sentence exceeds the learned position table of {m['max_len']} "
                 "(xfmr refuses it too): lower --max-len")
    ladder, max_tokens = train.get("ladder"), train["max_tokens"]

    def batches_of(sentences):
        lengths = [(len(s) + 1, len(s) + 1) for s in sentences]  # CausalLm::lengths
        if ladder:
            return ladder_batches(ladder, lengths, max_tokens, cap)
        return token_batches(lengths, max_tokens)

    batches, valid_batches = batches_of(examples), batches_of(valid)
    device = torch.device(args.device)
    model = build_model(torch, m, device)
    d = m["layer"]["d_model"]
    optim = torch.optim.Adam(model.parameters(), lr=0.0, betas=(train["beta_1"], train["beta_2"]),
                             eps=train["epsilon"], weight_decay=0.0)
    factor, warmup, decay = train["lr_factor"], train["warmup"], train.get("decay")
    if decay not in (None, "linear"):
        sys.exit(f"decay {decay!r} is not ported")
    minutes = args.minutes if args.minutes is not None else train.get("minutes")
    steps = args.steps if args.steps is not None else train["steps"]
    accumulate = train.get("accumulate", 1)
    eval_every, checkpoint_every = train["eval_every"], train["checkpoint_every"]
    keep = max(train.get("keep_checkpoints", 1), 1)

    def learning_rate(step, time_spent):
        """`Trainer::learning_rate` (trainer/optim.rs)."""
        if decay is None:
            return factor * d ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)
        peak = factor / (math.sqrt(d) * math.sqrt(warmup))
        spent = max(step / steps, time_spent)
        return peak * max(min(step / warmup, 1.0 - spent), 0.0)

    def tensors(rows):
        """`CausalLm::outputs`: inputs `[bos] ids`, targets `ids [eos]`, right-padded, on the
        ladder's shape when the run has a ladder (filler rows `[bos]` predicting nothing)."""
        inputs = [[bos] + s for s in rows]
        outputs = [s + [eos] for s in rows]
        width = max(map(len, inputs))
        if ladder:
            width = ladder_rung(ladder, width, cap)
            filler = max(max_tokens // max(width, 1), 1) - len(rows)
            inputs += [[bos]] * filler
            outputs += [[]] * filler
        pad_to = lambda r: r + [pad] * (width - len(r))  # noqa: E731
        return (torch.tensor([pad_to(r) for r in inputs], device=device),
                torch.tensor([pad_to(r) for r in outputs], device=device))

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def validate():
        """`evaluate_loss`: the NLL and token accuracy over the whole validation split, batched
        as training is, dropout off."""
        model.eval()
        nll, count, correct = 0.0, 0, 0
        with torch.inference_mode():
            for batch in valid_batches:
                rows = [valid[i] for i in batch]
                n = sum(len(s) + 1 for s in rows)
                ids, targets = tensors(rows)
                logits = model(ids)
                _, nll_sum = smoothed_loss(torch, logits, targets, pad, epsilon, n)
                hits = (logits.argmax(-1) == targets) & (targets != pad)
                nll, count, correct = nll + float(nll_sum), count + n, correct + int(hits.sum())
        model.train()
        return nll / count, count, correct / count

    checkpoints = args.out or tempfile.mkdtemp(prefix="torch-lm-")
    os.makedirs(checkpoints, exist_ok=True)
    saved = []

    def checkpoint(step):
        """A checkpoint as xfmr writes one every `checkpoint_every` steps: the model and Adam's
        state, the newest `keep_checkpoints` kept."""
        path = os.path.join(checkpoints, f"step-{step:08d}.pt")
        torch.save({"model": model.state_dict(), "optimizer": optim.state_dict(),
                    "step": step}, path + ".partial")
        os.replace(path + ".partial", path)
        saved.append(path)
        while len(saved) > keep:
            os.remove(saved.pop(0))

    if minutes is None and steps >= 2 ** 63:
        sys.exit("no budget: give --minutes or --steps")
    print(json.dumps({"examples": len(examples), "valid_examples": len(valid),
                      "batches_per_epoch": len(batches), "vocab": m["vocab_size"],
                      "parameters": sum(p.numel() for p in model.parameters()),
                      "minutes": minutes, "steps": steps if steps < 2 ** 63 else None,
                      "torch": torch.__version__, "device": str(device),
                      "threads": torch.get_num_threads()}), flush=True)
    # The untrained model, before the clock starts: its perplexity should be near the
    # vocabulary size (a check of the forward pass and of the loss).
    nll, valid_tokens, accuracy = validate()
    print(json.dumps({"step": 0, "train_s": 0.0, "valid_nll": nll, "valid_ppl": math.exp(nll),
                      "valid_accuracy": accuracy, "valid_tokens": valid_tokens, "tokens": 0}),
          flush=True)

    step, epoch, position = 0, 0, 0
    order = shuffled(len(batches), train["seed"], 0)
    tokens, target_tokens, stop = 0, 0, "steps"
    evaluated, last = False, None
    # The budget is wall-clock from here (`Trainer::run`'s start), validations and checkpoints
    # included, checked before every step, as xfmr counts it.
    started = time.perf_counter()
    elapsed = lambda: time.perf_counter() - started  # noqa: E731
    deadline = None if minutes is None else 60.0 * minutes
    while step < steps:
        if deadline is not None and elapsed() >= deadline:
            stop = "minutes"
            break
        time_spent = min(max(elapsed() / deadline, 0.0), 1.0) if deadline else 0.0
        picked = []
        for _ in range(accumulate):  # `Trainer::next_batch`
            if position == len(order):
                epoch, position = epoch + 1, 0
                order = shuffled(len(batches), train["seed"], epoch)
            picked.append([examples[i] for i in batches[order[position]]])
            position += 1
        total = sum(len(s) + 1 for rows in picked for s in rows)
        optim.zero_grad(set_to_none=True)
        loss_value = 0.0
        for rows in picked:
            n = sum(len(s) + 1 for s in rows)
            ids, targets = tensors(rows)
            loss, _ = smoothed_loss(torch, model(ids), targets, pad, epsilon, n)
            weighted = loss * (n / total)
            weighted.backward()
            loss_value += weighted.item()  # one host sync a micro-batch, as xfmr's
        lr = learning_rate(step + 1, time_spent)
        for group in optim.param_groups:
            group["lr"] = lr
        optim.step()
        sync()
        step += 1
        target_tokens += total
        tokens += 2 * total  # input `[bos] ids` + predicted `ids [eos]`, as xfmr's metrics
        if args.log_every and step % args.log_every == 0:
            print(json.dumps({"step": step, "epoch": epoch, "loss": loss_value, "lr": lr,
                              "tokens": tokens, "train_s": round(elapsed(), 3)}), flush=True)
        evaluated = step % eval_every == 0
        if evaluated:
            last = validate()
            nll, valid_tokens, accuracy = last
            print(json.dumps({"step": step, "train_s": round(elapsed(), 3), "valid_nll": nll,
                              "valid_ppl": math.exp(nll), "valid_accuracy": accuracy,
                              "valid_tokens": valid_tokens, "tokens": tokens}), flush=True)
        if step % checkpoint_every == 0:
            checkpoint(step)
    trained = elapsed()
    if step > 0 and not evaluated:
        last = validate()
        nll, valid_tokens, accuracy = last
        print(json.dumps({"step": step, "train_s": round(elapsed(), 3), "valid_nll": nll,
                          "valid_ppl": math.exp(nll), "valid_accuracy": accuracy,
                          "valid_tokens": valid_tokens, "tokens": tokens}), flush=True)
    if step > 0 and step % checkpoint_every != 0:
        checkpoint(step)
    wall = elapsed()
    if not args.out:
        shutil.rmtree(checkpoints, ignore_errors=True)
    nll, valid_tokens, accuracy = last if last else (float("nan"), 0, float("nan"))
    print(json.dumps({"final": True, "steps": step, "stop": stop,
                      "epochs": round(epoch + position / len(order), 3),
                      "train_s": round(trained, 2), "wall_s": round(wall, 2),
                      "tokens_per_s": round(tokens / trained) if trained else None,
                      "target_tokens_per_s": round(target_tokens / trained) if trained else None,
                      "target_tokens": target_tokens, "valid_ppl": math.exp(nll),
                      "valid_nll": nll, "valid_accuracy": accuracy,
                      "valid_tokens": valid_tokens}), flush=True)


if __name__ == "__main__":
    main()
