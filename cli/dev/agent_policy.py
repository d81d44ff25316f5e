"""Build the tiny agentic Qwen3 policy: a 2-layer Qwen3ForCausalLM whose weights are *constructed*
(not trained) so that, served by an unmodified engine with plain sampling, it runs one agent loop:

* last message a task "Use the <Tool> tool to run: <command>" and tools offered  ->
  ``<tool_call>\\n{"name": "<Tool>", "arguments": {"<key>": "<command>"}}\\n</tool_call><|im_end|>``
  (key ``cmd`` for ``exec_command``, else ``command``), the tool name and the command copied
  verbatim from the task;
* last message a tool result (``</tool_response>`` just before the generation prompt), or no
  tools, or no task  ->  ``Done.<|im_end|>``.

Why constructed: it is deterministic by design (numpy, fixed seed: same bytes on every build),
builds in seconds on CPU, and its behaviour does not depend on prompt length, because every
attention pattern it relies on is either a fixed relative offset (RoPE high frequencies) or an
exact content match (RoPE frequencies so low that they are position-invariant up to 40k tokens).

How it works (d = HIDDEN residual dims, laid out in named subspaces, see ``Layout``):

* Every token has a random unit code (CODE_DIM dims) keyed by its text with one leading space
  stripped, so " echo" and "echo" share a code; a separate sign dim says "has a leading space".
  Embeddings are tied: a token's embedding holds its code twice (CUR input dims and OUT output
  dims), the space sign, and a large constant BIAS that makes every RMSNorm a fixed scaling.
* Layer 1 attention (positional heads): PREV, PREV2 (codes of the tokens 1 and 2 back), SELF
  (moves the token's own OUT code/space sign away so logits start from zero) and PREV3 (two
  flags: was the token 3 back ``name`` / ``command``|``cmd``).
* Layer 1 MLP: a table of (current, previous, previous-2) token patterns -> actions. Most emit
  the next token of the fixed JSON template (write its code into OUT with weight 3), a few
  re-aim the copy head ("copy what follows 'Use the'" for the tool name, "what follows
  'run:'" for the command) and set flags.
* Layer 2 attention: COPY (an induction head: the query (current, previous) codes match the
  keys (previous, previous-2) codes, plus a mild recency bias; the value is the key token's code,
  written into OUT with weight 1), TASK (is there a "to run:" anywhere), TOOLS (is the Qwen3
  tools preamble "function signatures" in the prompt) and PREV5 (is the token 5 back
  ``</tool_response>``, i.e. the last message a tool result).
* Layer 2 MLP: the first output token (tool call or "Done"), the argument key, the terminators
  (copied " tool" -> ``",``; copied end of message/quote/newline -> ``"}}``) and the first piece
  of multi-token names such as "Bash" ("B" + "ash").

The logits are exactly the model's own (no processors); margins are large (tens of nats) so
sampling at temperature 1 almost always follows the greedy path.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from cli.dev import model_build

SEED = 20261123

VOCAB_SIZE = model_build.VOCAB_SIZE
CODE_DIM = 96  # token-code width; cross-talk between random codes ~ 1/sqrt(96)
HIDDEN = 640
LAYERS = 2
HEADS = 5
HEAD_DIM = 256  # 128 RoPE pairs: 30 positional, 2 ballast, 96 position-invariant (content)
INTERMEDIATE = 512
ROPE_THETA = 1e24  # pair j turns by 10**(-0.1875 j) rad/token: j>=32 moves < 0.05 rad in 40k
MAX_POSITIONS = 40960

BIAS = 100.0  # constant residual dim: makes RMSNorm ~ a fixed scale (other dims add < 0.3 %)
BALLAST = 1.0e4  # constant q/k dim (never matched) that makes q_norm/k_norm ~ fixed scales
LOGIT_SCALE = 40.0  # logit per unit of OUT code
SPACE_LOGIT = 15.0  # logit per unit of the space sign
EMIT = 3.0  # OUT weight of a template token (the copy head writes weight 1)
GATE_SHARPNESS = 100.0  # MLP rule neurons: silu(b x) ~ relu; two neurons make a 0/1 clamp
POS_MARGIN = 30.0  # positional heads: worst score margin (nats) of the target offset
COPY_SCORE = 120.0  # copy head: score per matched code (current->previous, previous->previous-2)
COPY_RECENCY = 20.0  # copy head: recency bonus range over 0..40k tokens (tie-breaker)
FLAG_SCORE = 40.0  # TASK/TOOLS heads: score per matched code

N_POS_PAIRS = 30
Q_BALLAST_PAIR, K_BALLAST_PAIR = 30, 31
TRIGRAM_PAIR = 29  # turns < 0.16 rad over 40k tokens: used as one more content dim
CONTENT_PAIR0 = 32

# The random model's Qwen3 config with this policy's sizes and rotary base.
CONFIG: dict[str, Any] = model_build.CONFIG | {
    "head_dim": HEAD_DIM,
    "hidden_size": HIDDEN,
    "initializer_range": 0.02,
    "intermediate_size": INTERMEDIATE,
    "layer_types": ["full_attention"] * LAYERS,
    "max_position_embeddings": MAX_POSITIONS,
    "max_window_layers": LAYERS,
    "num_attention_heads": HEADS,
    "num_hidden_layers": LAYERS,
    "num_key_value_heads": HEADS,
    "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA},
    "rope_theta": ROPE_THETA,
}

# Multi-piece first words: " Bash" is one token but "Bash" is "B"+"ash". Names whose first piece
# must be emitted unspaced are looked up here (tool names: anchor "the"; commands: anchor ":").
KNOWN_NAMES = [
    "Bash",
    "bash",
    "exec_command",
    "Read",
    "Edit",
    "Write",
    "Glob",
    "Grep",
    "Agent",
    "Skill",
    "WebFetch",
    "WebSearch",
    "NotebookEdit",
    "TaskCreate",
    "edit",
    "glob",
    "grep",
    "read",
    "skill",
    "task",
    "todowrite",
    "webfetch",
    "write",
    "write_stdin",
    "request_user_input",
    "view_image",
    "get_weather",
]
KNOWN_COMMANDS = [
    "echo",
    "ls",
    "cat",
    "pwd",
    "date",
    "wc",
    "head",
    "tail",
    "grep",
    "find",
    "mkdir",
    "touch",
    "rm",
    "cp",
    "mv",
    "python",
    "python3",
    "printf",
    "sed",
    "awk",
    "sort",
    "uniq",
    "whoami",
    "uname",
    "env",
    "which",
    "true",
    "false",
    "sleep",
    "seq",
    "expr",
    "basename",
    "dirname",
    "git",
    "node",
    "npm",
    "cd",
    "du",
    "df",
    "ps",
    "id",
    "hostname",
    "tr",
    "cut",
    "tee",
    "test",
    "stat",
    "file",
    "xargs",
    "yes",
    "printenv",
]


# ----------------------------------------------------------------------------- tokenizer


@dataclass
class Vocab:
    """Token strings (byte-level BPE form) and helpers."""

    tokens: list[str]
    ids: dict[str, int]
    encode: Any

    @classmethod
    def load(cls, tok_dir: Path) -> Vocab:
        from tokenizers import Tokenizer

        spec = json.loads((tok_dir / "tokenizer.json").read_text(encoding="utf-8"))
        tokens = [""] * VOCAB_SIZE
        for s, i in spec["model"]["vocab"].items():
            tokens[i] = s
        for t in spec["added_tokens"]:
            tokens[t["id"]] = t["content"]
        for i, s in enumerate(tokens):  # unused ids: distinct placeholder strings
            if not s:
                tokens[i] = f"<|unused_{i}|>"
        tk = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
        return cls(
            tokens,
            {s: i for i, s in enumerate(tokens)},
            lambda text: tk.encode(text, add_special_tokens=False).ids,
        )

    def id(self, text: str) -> int:
        ids = self.encode(text)
        if len(ids) != 1 and not text.startswith(" "):
            ids = self.encode(" " + text)  # codes are shared by the spaced variant
        if len(ids) != 1:
            raise ValueError(f"{text!r} is not one token: {ids}")
        return int(ids[0])


# ----------------------------------------------------------------------------- layout


class Layout:
    """Named residual subspaces: six code-sized blocks, then scalar dims."""

    cur = slice(0, CODE_DIM)  # code of the current token (embedding)
    prev = slice(CODE_DIM, 2 * CODE_DIM)  # code of the previous token (layer 0)
    prev2 = slice(2 * CODE_DIM, 3 * CODE_DIM)  # code of the token before that (layer 0)
    out = slice(3 * CODE_DIM, 4 * CODE_DIM)  # code of the next token: read by the LM head
    qa1 = slice(4 * CODE_DIM, 5 * CODE_DIM)  # copy-query adjustments (layer 0 MLP)
    qa2 = slice(5 * CODE_DIM, 6 * CODE_DIM)
    SCALARS: ClassVar[tuple[str, ...]] = (
        "bias",
        "sp",
        "sp_cur",
        "fo",
        "fix",
        "ss",
        "ks",
        "p3name",
        "p3cmd",
        "p3to",
        "qa3",
        "tools",
        "task",
        "r5",
        "is_tr",
        "is_name",
        "is_key",
        "is_to",
        "fo2",
        "r9",
    )

    def __init__(self) -> None:
        assert 6 * CODE_DIM + len(self.SCALARS) <= HIDDEN
        for i, name in enumerate(self.SCALARS):
            setattr(self, name, 6 * CODE_DIM + i)

    bias: int
    sp: int  # space sign (input: the token's; after layer 0: the next token's)
    sp_cur: int  # the current token's space sign (moved here by layer 0)
    fo: int  # first output position (after "<|im_start|>assistant\n")
    fix: int  # a template token is emitted here (disables terminators)
    ss: int  # slot start: the first word of the name / command is copied here
    ks: int  # key slot: the argument key is chosen here
    p3name: int
    p3cmd: int
    p3to: int  # the token 3 back is " to" (key side of the "to run:" anchor)
    qa3: int  # query side: ask for keys whose token 3 back is " to"
    tools: int
    task: int
    r5: int
    # Exact 0/1 token flags in the embedding (random codes cross-talk up to ~0.4):
    is_tr: int  # </tool_response>
    is_name: int  # name
    is_key: int  # command / cmd
    is_to: int  # to / " to"
    fo2: int  # first output position after an empty think block (enable_thinking=False)
    r9: int  # the token 9 back is </tool_response> (last message a tool result, think block)


L = Layout()


def make_codes(vocab: Vocab, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Unit code per token, shared by the spaced and unspaced variants; space sign +-1."""
    stripped = [s[1:] if s.startswith("Ġ") and len(s) > 1 else s for s in vocab.tokens]
    keys = sorted(set(stripped))
    index = {k: i for i, k in enumerate(keys)}
    table = rng.standard_normal((len(keys), CODE_DIM)).astype(np.float64)
    table /= np.linalg.norm(table, axis=1, keepdims=True)
    codes = table[[index[s] for s in stripped]]
    sp = np.array([1.0 if s.startswith("Ġ") and len(s) > 1 else -1.0 for s in vocab.tokens])
    return codes, sp


# ----------------------------------------------------------------------------- RoPE helpers


def inv_freq() -> np.ndarray:
    """As vLLM/transformers compute it (float32)."""
    exps = np.arange(0, HEAD_DIM, 2, dtype=np.float32) / np.float32(HEAD_DIM)
    return (1.0 / (np.float32(ROPE_THETA) ** exps)).astype(np.float64)


@functools.cache
def positional_amplitudes() -> tuple[np.ndarray, float]:
    """Per-pair weights a_j (sum 1) of a score sum_j a_j cos(theta_j (delta - k)): peaked at
    delta == k; returns the weights and the worst margin over delta in [0, MAX_POSITIONS]."""
    j = np.arange(N_POS_PAIRS)
    a = np.exp(-j / 4.0)
    a /= a.sum()
    th = inv_freq()[:N_POS_PAIRS]
    d = np.arange(0, MAX_POSITIONS + 1, dtype=np.float64)
    s = np.cos(np.outer(d - 1, th)) @ a
    margin = float((s[1] - np.delete(s, 1)).min())
    return a, margin


@functools.cache
def recency_weights() -> np.ndarray:
    """Weights b_j for sum_j b_j cos(theta_j delta) ~ a decreasing function of delta (a bonus
    for recent keys), fitted on the low-frequency positional pairs by ridge least squares."""
    th = inv_freq()[:N_POS_PAIRS]
    d = np.unique(np.round(np.geomspace(1, MAX_POSITIONS, 4000)))
    target = -np.log1p(d / 50.0) / np.log1p(MAX_POSITIONS / 50.0)
    use = np.arange(16, TRIGRAM_PAIR)
    a = np.cos(np.outer(d, th[use]))
    a = np.hstack([a, np.ones((len(d), 1))])
    lam = 1e-3
    x = np.linalg.solve(a.T @ a + lam * np.eye(a.shape[1]), a.T @ target)
    b = np.zeros(N_POS_PAIRS)
    b[use] = x[:-1]
    return b


# ----------------------------------------------------------------------------- builder


class Builder:
    def __init__(self, vocab: Vocab, seed: int) -> None:
        self.v = vocab
        rng = np.random.default_rng(seed)
        self.codes, self.sp = make_codes(vocab, rng)
        self.rho = BIAS / np.sqrt(HIDDEN)  # rms of the residual (BIAS dominates)
        self.w: dict[str, np.ndarray] = {}
        self.mlp_rows: list[list[tuple[np.ndarray, np.ndarray]]] = [[], []]

    # -- token helpers
    def c(self, text: str) -> np.ndarray:
        code: np.ndarray = self.codes[self.v.id(text)]
        return code

    def s(self, text: str) -> float:
        return float(self.sp[self.v.id(text)])

    # -- embeddings
    def embeddings(self) -> np.ndarray:
        e = np.zeros((VOCAB_SIZE, HIDDEN))
        e[:, L.cur] = self.codes
        e[:, L.out] = self.codes
        e[:, L.sp] = self.sp
        e[:, L.bias] = BIAS
        for dim, texts in (
            (L.is_tr, ["</tool_response>"]),
            (L.is_name, ["name"]),
            (L.is_key, ["command", "cmd"]),
            (L.is_to, ["to", " to"]),
        ):
            for text in texts:
                e[self.v.encode(text)[0], dim] = 1.0
        return e

    # -- attention
    def _head_qk(self) -> tuple[np.ndarray, np.ndarray]:
        """(HEAD_DIM, HIDDEN) raw q and k maps with only the ballast filled in."""
        q = np.zeros((HEAD_DIM, HIDDEN))
        k = np.zeros((HEAD_DIM, HIDDEN))
        q[Q_BALLAST_PAIR, L.bias] = BALLAST / BIAS
        k[HEAD_DIM // 2 + K_BALLAST_PAIR, L.bias] = BALLAST / BIAS
        return q, k

    def positional(self, q: np.ndarray, k: np.ndarray, offset: int, total: float) -> None:
        """Add a score total * sum_j a_j cos(theta_j (delta - offset)) (q.k is divided by
        sqrt(HEAD_DIM) by the engine)."""
        a, _ = positional_amplitudes()
        th = inv_freq()[:N_POS_PAIRS]
        self._cosines(q, k, a * total, th * offset)

    def _cosines(self, q: np.ndarray, k: np.ndarray, amp: np.ndarray, phase: np.ndarray) -> None:
        half = HEAD_DIM // 2
        for j in range(N_POS_PAIRS):
            if amp[j] == 0:
                continue
            m = np.sqrt(abs(amp[j]) * np.sqrt(HEAD_DIM))
            sign = 1.0 if amp[j] > 0 else -1.0
            q[j, L.bias] += m / BIAS
            k[j, L.bias] += sign * m * np.cos(phase[j]) / BIAS
            k[half + j, L.bias] += sign * m * np.sin(phase[j]) / BIAS

    def content(
        self,
        q: np.ndarray,
        k: np.ndarray,
        which: int,
        qmap: np.ndarray,
        kmap: np.ndarray,
        score: float,
    ) -> None:
        """Score += score * (qmap x) . (kmap x): code-sized maps placed in content block
        ``which`` (0: first halves of the content pairs, 1: second halves)."""
        rows = np.arange(CONTENT_PAIR0, HEAD_DIM // 2) + which * (HEAD_DIM // 2)
        f = np.sqrt(score * np.sqrt(HEAD_DIM))
        q[rows] += f * qmap
        k[rows] += f * kmap

    def sel(self, sub: slice) -> np.ndarray:
        """(CODE_DIM, HIDDEN) map reading a code subspace."""
        m = np.zeros((CODE_DIM, HIDDEN))
        m[:, sub] = np.eye(CODE_DIM)
        return m

    def scalar_map(
        self, terms: list[tuple[slice | int, np.ndarray | float]], const: float = 0.0
    ) -> np.ndarray:
        """(HIDDEN,) linear functional: sum of <code, x[sub]> or c * x[dim], plus a constant."""
        r = np.zeros(HIDDEN)
        for sub, vec in terms:
            if isinstance(sub, slice):
                r[sub] += vec
            else:
                r[sub] += float(vec)
        r[L.bias] += const / BIAS
        return r

    def attention(self, layer: int, heads: list[dict[str, np.ndarray]]) -> None:
        p = f"model.layers.{layer}.self_attn."
        qs, ks, vs, os_ = [], [], [], []
        for h in heads:
            qs.append(h["q"])
            ks.append(h["k"])
            vs.append(h.get("v", np.zeros((HEAD_DIM, HIDDEN))))
            os_.append(h.get("o", np.zeros((HIDDEN, HEAD_DIM))))
        self.w[p + "q_proj.weight"] = np.concatenate(qs)
        self.w[p + "k_proj.weight"] = np.concatenate(ks)
        self.w[p + "v_proj.weight"] = np.concatenate(vs)
        self.w[p + "o_proj.weight"] = np.concatenate(os_, axis=1)
        self.w[p + "q_norm.weight"] = np.full(HEAD_DIM, BALLAST / np.sqrt(HEAD_DIM))
        self.w[p + "k_norm.weight"] = np.full(HEAD_DIM, BALLAST / np.sqrt(HEAD_DIM))

    def pos_head(self, offset: int, v: np.ndarray, o: np.ndarray) -> dict[str, np.ndarray]:
        q, k = self._head_qk()
        _, margin = positional_amplitudes()
        self.positional(q, k, offset, POS_MARGIN / margin)
        return {"q": q, "k": k, "v": v, "o": o}

    # -- MLP rules
    def rule(
        self, layer: int, conds: list[tuple[slice | int, np.ndarray | float]], writes: np.ndarray
    ) -> None:
        """A 0/1 detector of ``sum(conds) >= n - 0.5`` (each condition ~1 when it holds) that
        adds ``writes`` to the residual; conditions with a negative weight are vetoes."""
        n = sum(1 for _, w in conds if not (isinstance(w, float) and w < 0))
        g = self.scalar_map(conds, const=-(n - 0.5)) * GATE_SHARPNESS
        width = 0.4 * GATE_SHARPNESS
        self.mlp_rows[layer].append((g, writes / width))
        g2 = g.copy()
        g2[L.bias] -= width / BIAS
        self.mlp_rows[layer].append((g2, -writes / width))

    def emit(self, text: str, strength: float = EMIT) -> np.ndarray:
        w = np.zeros(HIDDEN)
        w[L.out] = strength * self.c(text)
        w[L.sp] = strength * self.s(text)
        return w

    def put(self, **kv: Any) -> np.ndarray:
        w = np.zeros(HIDDEN)
        for name, val in kv.items():
            w[getattr(L, name)] += val
        return w

    def mlp(self, layer: int) -> None:
        rows = self.mlp_rows[layer]
        assert len(rows) <= INTERMEDIATE, (layer, len(rows))
        gate = np.zeros((INTERMEDIATE, HIDDEN))
        up = np.zeros((INTERMEDIATE, HIDDEN))
        down = np.zeros((HIDDEN, INTERMEDIATE))
        for i, (g, d) in enumerate(rows):
            gate[i] = g
            up[i, L.bias] = 1.0 / BIAS
            down[:, i] = d
        p = f"model.layers.{layer}.mlp."
        self.w[p + "gate_proj.weight"] = gate
        self.w[p + "up_proj.weight"] = up
        self.w[p + "down_proj.weight"] = down

    # -- the program
    def build(self) -> dict[str, np.ndarray]:
        c, ones = self.c, np.ones
        self.w["model.embed_tokens.weight"] = self.embeddings()
        for i in range(LAYERS):
            self.w[f"model.layers.{i}.input_layernorm.weight"] = ones(HIDDEN) * self.rho
            self.w[f"model.layers.{i}.post_attention_layernorm.weight"] = ones(HIDDEN) * self.rho
        final = np.zeros(HIDDEN)
        final[L.out] = self.rho * LOGIT_SCALE
        final[L.sp] = self.rho * SPACE_LOGIT
        self.w["model.norm.weight"] = final

        # ---- layer 0 attention: PREV, PREV2, SELF, PREV3
        def move(src: slice, dst: slice, sign: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
            v = np.zeros((HEAD_DIM, HIDDEN))
            o = np.zeros((HIDDEN, HEAD_DIM))
            v[:CODE_DIM, src] = np.eye(CODE_DIM)
            o[dst, :CODE_DIM] = sign * np.eye(CODE_DIM)
            return v, o

        h_prev = self.pos_head(1, *move(L.cur, L.prev))
        h_prev2 = self.pos_head(2, *move(L.cur, L.prev2))
        v, o = move(L.out, L.out, -1.0)
        v[CODE_DIM, L.sp] = 1.0
        o[L.sp, CODE_DIM] = -1.0
        o[L.sp_cur, CODE_DIM] = 1.0
        h_self = self.pos_head(0, v, o)
        v = np.zeros((HEAD_DIM, HIDDEN))
        o = np.zeros((HIDDEN, HEAD_DIM))
        v[0, L.is_name] = 1.0
        v[1, L.is_key] = 1.0
        o[L.p3name, 0] = 1.0
        o[L.p3cmd, 1] = 1.0
        v[2, L.is_to] = 1.0
        o[L.p3to, 2] = 1.0
        h_prev3 = self.pos_head(3, v, o)
        idle = dict(zip("qk", self._head_qk(), strict=True))
        self.attention(0, [h_prev, h_prev2, h_self, h_prev3, idle])

        # ---- layer 0 MLP: the template state machine
        cur, prev, prev2 = L.cur, L.prev, L.prev2
        r = self.rule
        fix = self.put(fix=1.0)
        r(0, [(cur, c("\n")), (prev, c("assistant")), (prev2, c("<|im_start|>"))], self.put(fo=1.0))
        r(0, [(cur, c("<tool_call>"))], self.emit("\n") + fix)
        r(0, [(cur, c("\n")), (prev, c("<tool_call>"))], self.emit('{"') + fix)
        r(0, [(cur, c('{"')), (prev, c("\n"))], self.emit("name") + fix)
        r(0, [(cur, c("name")), (prev, c('{"'))], self.emit('":') + fix)
        r(0, [(cur, c('":')), (prev, c("name"))], self.emit(' "') + fix)
        anchor_name = self.put(qa1=c("the") - c(' "'), qa2=c("Use") - c('":'), ss=1.0, sp=-2.0)
        r(0, [(cur, c(' "')), (prev, c('":')), (prev2, c("name"))], anchor_name)
        r(0, [(cur, c('",'))], self.emit(' "') + fix)
        r(0, [(cur, c(' "')), (prev, c('",'))], self.emit("arguments") + fix)
        r(0, [(cur, c("arguments")), (prev, c(' "'))], self.emit('":') + fix)
        r(0, [(cur, c('":')), (prev, c("arguments"))], self.emit(' {"') + fix)
        anchor_key = self.put(qa1=c("the") - c(' {"'), qa2=c("Use") - c('":'), ks=1.0, fix=1.0)
        r(0, [(cur, c(' {"')), (prev, c('":')), (prev2, c("arguments"))], anchor_key)
        for key in ("command", "cmd"):
            r(0, [(cur, c(key)), (prev, c(' {"'))], self.emit('":') + fix)
            r(0, [(cur, c('":')), (prev, c(key))], self.emit(' "') + fix)
            anchor_cmd = self.put(
                qa1=c(":") - c(' "'), qa2=c("run") - c('":'), qa3=1.0, ss=1.0, sp=-2.0
            )
            r(0, [(cur, c(' "')), (prev, c('":')), (prev2, c(key))], anchor_cmd)
        r(0, [(cur, c('"}}'))], self.emit("\n") + fix)
        r(0, [(cur, c("\n")), (prev, c('"}}'))], self.emit("</tool_call>") + fix)
        r(0, [(cur, c("</tool_call>"))], self.emit("<|im_end|>") + fix)
        r(0, [(cur, c("\n\n")), (prev, c("</think>")), (prev2, c("\n\n"))], self.put(fo2=1.0))
        r(0, [(cur, c("Done")), (prev, c("\n"))], self.emit(".") + fix)
        r(0, [(cur, c("Done")), (prev, c("\n\n"))], self.emit(".") + fix)
        r(0, [(cur, c(".")), (prev, c("Done"))], self.emit("<|im_end|>") + fix)
        # First continuation step: match (first word, anchor token) instead of (word, ' "').
        r(0, [(prev, c(' "')), (prev2, c('":')), (L.p3name, 1.0)], self.put(qa2=c("the") - c(' "')))
        r(0, [(prev, c(' "')), (prev2, c('":')), (L.p3cmd, 1.0)], self.put(qa2=c(":") - c(' "')))
        multi = self.multi_piece_words()
        for word, p1, p2, anchor in multi:
            r(0, [(cur, c(p1)), (prev, c(' "')), (prev2, c('":'))], self.emit(p2) + fix)
            r(
                0,
                [(cur, c(p2)), (prev, c(p1)), (prev2, c(' "'))],
                self.put(qa1=c(word) - c(p2), qa2=c(anchor) - c(p1)),
            )
        self.mlp(0)

        # ---- layer 1 attention: COPY, TASK, TOOLS, PREV5
        q, k = self._head_qk()
        self.content(q, k, 0, self.sel(L.cur) + self.sel(L.qa1), self.sel(L.prev), COPY_SCORE)
        self.content(q, k, 1, self.sel(L.prev) + self.sel(L.qa2), self.sel(L.prev2), COPY_SCORE)
        # Third anchor condition ("to" before "run:") on the nearly invariant pair TRIGRAM_PAIR.
        f = np.sqrt(COPY_SCORE * np.sqrt(HEAD_DIM))
        q[TRIGRAM_PAIR, L.qa3] = f
        k[TRIGRAM_PAIR, L.p3to] = f
        b = recency_weights()
        self._cosines(q, k, b * COPY_RECENCY, np.zeros(N_POS_PAIRS))
        v = np.zeros((HEAD_DIM, HIDDEN))
        o = np.zeros((HIDDEN, HEAD_DIM))
        v[:CODE_DIM, L.cur] = np.eye(CODE_DIM)
        v[CODE_DIM, L.sp_cur] = 1.0
        o[L.out, :CODE_DIM] = np.eye(CODE_DIM)
        o[L.sp, CODE_DIM] = 1.0
        h_copy = {"q": q, "k": k, "v": v, "o": o}

        def flag_head(conds: list[tuple[slice, np.ndarray]], dst: int) -> dict[str, Any]:
            """Attend to positions where all code conditions hold; write (matches - n + 1):
            ~1 if such a position exists, <= ~0 otherwise."""
            q, k = self._head_qk()
            qm = np.zeros((CODE_DIM, HIDDEN))
            km = np.zeros((CODE_DIM, HIDDEN))
            qm[0, L.bias] = 1.0 / BIAS
            km[0] = self.scalar_map(list(conds))
            self.content(q, k, 0, qm, km, FLAG_SCORE)
            v = np.zeros((HEAD_DIM, HIDDEN))
            o = np.zeros((HIDDEN, HEAD_DIM))
            v[0] = self.scalar_map(list(conds), const=-(len(conds) - 1.0))
            o[dst, 0] = 1.0
            return {"q": q, "k": k, "v": v, "o": o}

        h_task = flag_head([(L.cur, c(":")), (L.prev, c("run")), (L.prev2, c("to"))], L.task)
        h_tools = flag_head([(L.cur, c("signatures")), (L.prev, c("function"))], L.tools)
        v = np.zeros((HEAD_DIM, HIDDEN))
        o = np.zeros((HIDDEN, HEAD_DIM))
        v[0, L.is_tr] = 1.0
        o[L.r5, 0] = 1.0
        h_prev5 = self.pos_head(5, v, o)
        o = np.zeros((HIDDEN, HEAD_DIM))
        o[L.r9, 0] = 1.0
        h_prev9 = self.pos_head(9, v, o)
        self.attention(1, [h_copy, h_task, h_tools, h_prev5, h_prev9])

        # ---- layer 1 MLP: first token, key, terminators, multi-piece first words
        out = L.out
        for first, result in ((L.fo, L.r5), (L.fo2, L.r9)):
            r(1, [(first, 1.0)], self.emit("Done"))
            r(
                1,
                [(first, 1.0), (L.tools, 1.0), (L.task, 1.0), (result, -2.0)],
                self.emit("<tool_call>", 2 * EMIT) + self.put(out=-EMIT * c("Done")),
            )
        r(1, [(L.ks, 1.0)], self.emit("command"))
        r(
            1,
            [(L.ks, 1.0), (out, c("exec"))],
            self.emit("cmd", 2 * EMIT) + self.put(out=-EMIT * c("command")),
        )
        r(1, [(out, c("tool")), (L.fix, -10.0)], self.emit('",'))
        for end in ("<|im_end|>", '"', "\n", "\n\n"):
            r(1, [(out, c(end)), (L.fix, -10.0)], self.emit('"}}'))
        for word, p1, _, _ in multi:
            r(1, [(L.ss, 1.0), (out, c(word))], self.emit(p1))
        self.mlp(1)
        return {name: t.astype(np.float32) for name, t in self.w.items()}

    def multi_piece_words(self) -> list[tuple[str, str, str, str]]:
        """(word, piece1, piece2, anchor) for known words whose spaced form is one token and
        whose unspaced form is exactly two."""
        found = []
        for words, anchor in ((KNOWN_NAMES, "the"), (KNOWN_COMMANDS, ":")):
            for w in words:
                spaced, plain = self.v.encode(" " + w), self.v.encode(w)
                if len(spaced) == 1 and len(plain) == 2:
                    p1, p2 = (self.v.tokens[i].replace("Ġ", " ") for i in plain)
                    found.append((w, p1, p2, anchor))
        return found


# Everything besides CONFIG that determines the weights (model_build hashes it into the recipe).
RECIPE: dict[str, Any] = {
    "code_dim": CODE_DIM,
    "bias": BIAS,
    "ballast": BALLAST,
    "logit_scale": LOGIT_SCALE,
    "space_logit": SPACE_LOGIT,
    "emit": EMIT,
    "gate_sharpness": GATE_SHARPNESS,
    "pos_margin": POS_MARGIN,
    "copy_score": COPY_SCORE,
    "copy_recency": COPY_RECENCY,
    "flag_score": FLAG_SCORE,
    "known_names": KNOWN_NAMES,
    "known_commands": KNOWN_COMMANDS,
    "numpy": np.__version__,
    "code": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
}


def make_weights(tokenizer_dir: Path, seed: int = SEED) -> dict[str, np.ndarray]:
    """The policy's tensors, under the names vLLM and transformers load (tied embeddings)."""
    return Builder(Vocab.load(tokenizer_dir), seed).build()
