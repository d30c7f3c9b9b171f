"""The ILQL network: a GPT-2 backbone with a policy head, double Q heads, target Q heads and V.

    tokens ──► GPT-2 (transformers, built from a local GPT2Config) ──► hidden h_t
        h_t ──► lm_head            policy logits π(·|s_t)           (the exported HF model)
        h_t ──► q1, q2             Q(s_t, ·) over the vocabulary    (per-token Q)
        h_t ──► target_q1, _q2     Polyak copies of q1, q2 (rate alpha)
        h_t ──► v                  V(s_t)

The hidden state at position p is the state in which token p+1 was chosen, so an action index
`p` in `action_idxs` means "the action is tokens[p + 1]".

Architecture mutations are function-preserving where they grow:
* `add_layer`: a new GPT-2 block whose two residual output projections (attn.c_proj, mlp.c_proj)
  are zero, so the block adds nothing to the residual stream;
* `widen_ff`: k new units per block, new rows of mlp.c_fc random, new rows of mlp.c_proj zero.
Removing a block cannot preserve the function; `remove_layer` drops the block with the smallest
residual output weights and says so.

`net_config["pretrained"] = "dir"` starts the backbone from a local GPT-2-family checkpoint
(`GPT2LMHeadModel.from_pretrained(dir, local_files_only=True)`, never fetched); its shape keys are
read from the checkpoint (`resolve_pretrained`) and the heads are added on top. Every mutation
above works on it unchanged. A member rebuilt from its state needs only the saved GPT-2 config,
not the directory.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.activations import NewGELUActivation
from transformers.models.gpt2.modeling_gpt2 import GPT2Block

from evo.evolvable import ParamChange, make_activation

__all__ = ["ILQLModel", "DEFAULT_NET_CONFIG", "HF_ACTIVATIONS", "build_gpt2_config", "check_net_config",
           "resolve_pretrained"]

DEFAULT_NET_CONFIG: dict[str, Any] = {
    "arch": "gpt",
    "n_layer": 2,
    "n_embd": 64,
    "n_head": 2,
    "dim_feedfwd": 256,
    "dropout": 0.0,
    "layer_norm_eps": 1e-5,
    "block_size": 16,
    "activation": "GELU",
    "bias": True,
    "vocab_size": 32,
    "min_layers": 1,
    "max_layers": 4,
}

#: evo activation name -> transformers ACT2FN name (what a Hugging Face config can express)
HF_ACTIVATIONS: dict[str, str] = {
    "GELU": "gelu",
    "ReLU": "relu",
    "Tanh": "tanh",
    "Sigmoid": "sigmoid",
    "PReLU": "prelu",
    "SiLU": "silu",
    "LeakyReLU": "leaky_relu",
    "GELUTanh": "gelu_new",
}

#: a pretrained config's activation_function -> the evo activation that computes the same function
_FROM_HF = {"gelu_new": "GELUTanh", "gelu_pytorch_tanh": "GELUTanh", "gelu": "GELU", "relu": "ReLU",
            "silu": "SiLU", "swish": "SiLU", "tanh": "Tanh", "sigmoid": "Sigmoid", "leaky_relu": "LeakyReLU"}

# shape keys a pretrained checkpoint fixes (net_config key -> how to read it from a GPT2Config)
_PRETRAINED_KEYS = {
    "n_layer": lambda c: c.n_layer,
    "n_embd": lambda c: c.n_embd,
    "n_head": lambda c: c.n_head,
    "dim_feedfwd": lambda c: c.n_inner or 4 * c.n_embd,
    "dropout": lambda c: float(c.resid_pdrop),
    "layer_norm_eps": lambda c: float(c.layer_norm_epsilon),
    "block_size": lambda c: c.n_positions,
    "vocab_size": lambda c: c.vocab_size,
}


def _make_act(name: str) -> nn.Module:
    """The activation module for `name`; GELUTanh is transformers' own gelu_new, so a pretrained GPT-2
    computes exactly what it computed before and its export reloads bit for bit."""
    return NewGELUActivation() if name == "GELUTanh" else make_activation(name)


def _pretrained_config(path: str) -> GPT2Config:
    p = Path(path)
    if not (p / "config.json").is_file():
        raise ValueError(f"arch.pretrained: expected a local Hugging Face model directory with config.json, found {path!r}")
    try:
        config = GPT2Config.from_pretrained(str(p), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ValueError(f"arch.pretrained: cannot read a GPT-2 config from {path!r} ({exc})") from None
    if config.model_type != "gpt2":
        raise ValueError(f"arch.pretrained: expected a GPT-2-family model (model_type 'gpt2'), found {config.model_type!r}")
    return config


def resolve_pretrained(arch: dict[str, Any]) -> dict[str, Any]:
    """Fill the shape keys of an `arch` with `pretrained` from the checkpoint's config.json (offline).

    Keys the checkpoint fixes may be left out; given, they must agree. Layer bounds default to
    [1, n_layer + 2]. The path is made absolute so workers started elsewhere find it."""
    if not arch.get("pretrained"):
        return dict(arch)
    if not isinstance(arch["pretrained"], str):
        raise ValueError(f"arch.pretrained: expected a directory path, found {arch['pretrained']!r}")
    path = str(Path(arch["pretrained"]).expanduser().resolve())
    config = _pretrained_config(path)
    out = dict(arch, pretrained=path)
    for key, read in _PRETRAINED_KEYS.items():
        value = read(config)
        if key in arch and arch[key] != value:
            raise ValueError(f"arch.{key}: the pretrained model in {path} has {value}, found {arch[key]!r} "
                             "(leave it out: the checkpoint sets it)")
        out[key] = value
    act = _FROM_HF.get(config.activation_function)
    if act is None:
        raise ValueError(f"arch.pretrained: activation {config.activation_function!r} has no evo equivalent "
                         f"(expected one of {sorted(_FROM_HF)})")
    if "activation" in arch and arch["activation"] != act:
        raise ValueError(f"arch.activation: the pretrained model in {path} uses {act}, found {arch['activation']!r}")
    out["activation"] = act
    out.setdefault("min_layers", 1)
    out.setdefault("max_layers", out["n_layer"] + 2)
    return out


def check_net_config(net_config: dict[str, Any]) -> dict[str, Any]:
    """Fill defaults and refuse what a GPT-2 backbone cannot be: 'arch.FIELD: expected …, found …'."""
    unknown = sorted(set(net_config) - set(DEFAULT_NET_CONFIG) - {"pretrained"})
    if unknown:
        raise ValueError(f"arch.{unknown[0]}: unknown key; expected some of {sorted(DEFAULT_NET_CONFIG)}")
    cfg = {**DEFAULT_NET_CONFIG, **net_config}
    if cfg["arch"] != "gpt":
        raise ValueError(f"arch.arch: expected 'gpt', found {cfg['arch']!r}")
    for key in ("n_layer", "n_embd", "n_head", "dim_feedfwd", "block_size", "vocab_size", "min_layers", "max_layers"):
        if not isinstance(cfg[key], int) or isinstance(cfg[key], bool) or cfg[key] < (0 if key == "min_layers" else 1):
            raise ValueError(f"arch.{key}: expected a positive integer, found {cfg[key]!r}")
    if cfg["n_embd"] % cfg["n_head"]:
        raise ValueError(f"arch.n_head: expected a divisor of n_embd={cfg['n_embd']}, found {cfg['n_head']}")
    if not cfg["min_layers"] <= cfg["n_layer"] <= cfg["max_layers"]:
        raise ValueError(f"arch.n_layer: expected within [min_layers={cfg['min_layers']}, "
                         f"max_layers={cfg['max_layers']}], found {cfg['n_layer']}")
    if not 0.0 <= float(cfg["dropout"]) < 1.0:
        raise ValueError(f"arch.dropout: expected a probability in [0, 1), found {cfg['dropout']!r}")
    if cfg["bias"] is not True:
        raise ValueError(f"arch.bias: expected true (GPT-2 Conv1D layers always carry a bias), found {cfg['bias']!r}")
    make_activation(cfg["activation"])  # raises with the list of known names
    if "pretrained" in cfg and (not isinstance(cfg["pretrained"], str) or not cfg["pretrained"]):
        raise ValueError(f"arch.pretrained: expected a local model directory, found {cfg['pretrained']!r}")
    return cfg


def build_gpt2_config(cfg: dict[str, Any]) -> GPT2Config:
    """A GPT2Config built locally from net_config (never fetched)."""
    return GPT2Config(
        vocab_size=cfg["vocab_size"],
        n_positions=cfg["block_size"],
        n_embd=cfg["n_embd"],
        n_layer=cfg["n_layer"],
        n_head=cfg["n_head"],
        n_inner=cfg["dim_feedfwd"],
        activation_function=HF_ACTIVATIONS.get(cfg["activation"], "gelu"),
        resid_pdrop=cfg["dropout"],
        embd_pdrop=cfg["dropout"],
        attn_pdrop=cfg["dropout"],
        layer_norm_epsilon=cfg["layer_norm_eps"],
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        tie_word_embeddings=False,
    )


def _head(n_embd: int, out: int) -> nn.Sequential:
    """trlx's head shape: Linear(h, 2h) → ReLU → Linear(2h, out)."""
    return nn.Sequential(nn.Linear(n_embd, 2 * n_embd), nn.ReLU(), nn.Linear(2 * n_embd, out))


class ILQLModel(nn.Module):
    """GPT-2 + policy, Q, target Q and V heads. `forward` gathers heads at the given indices."""

    def __init__(self, net_config: dict[str, Any], double_q: bool = True, gpt_config: dict[str, Any] | None = None) -> None:
        """`gpt_config` (a saved GPT2Config dict) rebuilds a pretrained-based member's backbone shape
        without its directory; the weights then come from the member's state."""
        super().__init__()
        self.net_config = check_net_config(net_config)
        self.double_q = double_q
        cfg = self.net_config
        if gpt_config is not None:
            self.gpt = GPT2LMHeadModel(GPT2Config.from_dict(gpt_config))
        elif cfg.get("pretrained"):
            self.gpt = GPT2LMHeadModel.from_pretrained(cfg["pretrained"], local_files_only=True, dtype=torch.float32)
            self._check_pretrained()
        else:
            self.gpt = GPT2LMHeadModel(build_gpt2_config(cfg))  # .transformer = backbone, .lm_head = policy
        self.gpt.config.use_cache = False
        self._install_activation(cfg["activation"])
        vocab, n_embd = cfg["vocab_size"], cfg["n_embd"]
        self.q1 = _head(n_embd, vocab)
        self.q2 = _head(n_embd, vocab) if double_q else None
        self.v = _head(n_embd, 1)
        self.target_q1 = copy.deepcopy(self.q1).requires_grad_(False)
        self.target_q2 = copy.deepcopy(self.q2).requires_grad_(False) if double_q else None

    def _check_pretrained(self) -> None:
        c = self.gpt.config
        have = {key: read(c) for key, read in _PRETRAINED_KEYS.items()}
        for key, value in have.items():
            if self.net_config[key] != value:
                raise ValueError(f"arch.{key}: the pretrained model in {self.net_config['pretrained']} has {value}, "
                                 f"found {self.net_config[key]!r}")

    def gpt_config(self) -> dict[str, Any]:
        """The backbone's current GPT2Config (mutations keep it in step) as a JSON-able dict."""
        return self.gpt.config.to_dict()

    # ---- forward ------------------------------------------------------------------------------
    def hidden(self, tokens: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        mask = None if attn_mask is None else attn_mask.long()
        return self.gpt.transformer(input_ids=tokens, attention_mask=mask, use_cache=False).last_hidden_state

    def q_heads(self) -> list[nn.Module]:
        return [self.q1] + ([self.q2] if self.q2 is not None else [])

    def target_heads(self) -> list[nn.Module]:
        return [self.target_q1] + ([self.target_q2] if self.target_q2 is not None else [])

    def forward(self, tokens: torch.Tensor, state_idxs: torch.Tensor, action_idxs: torch.Tensor,
                attn_mask: torch.Tensor | None = None, detach_v: bool = False, detach_q: bool = False,
                detach_pi: bool = False) -> dict[str, Any]:
        """Returns logits (B, L, V); qs, target_qs: lists of (B, A, V) at action_idxs; vs: (B, S) at state_idxs."""
        h = self.hidden(tokens, attn_mask)
        n_embd = h.shape[-1]
        h_act = h.gather(1, action_idxs.unsqueeze(-1).expand(-1, -1, n_embd))
        h_state = h.gather(1, state_idxs.unsqueeze(-1).expand(-1, -1, n_embd))
        h_q = h_act.detach() if detach_q else h_act
        with torch.no_grad():
            target_qs = [head(h_act.detach()) for head in self.target_heads()]
        return {
            "logits": self.gpt.lm_head(h.detach() if detach_pi else h),
            "qs": [head(h_q) for head in self.q_heads()],
            "target_qs": target_qs,
            "vs": self.v(h_state.detach() if detach_v else h_state).squeeze(-1),
        }

    @torch.no_grad()
    def step_outputs(self, tokens: torch.Tensor, attn_mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Last-position policy logits, min target Q and V, for decoding."""
        h = self.hidden(tokens, attn_mask)[:, -1]
        target_q = torch.stack([head(h) for head in self.target_heads()]).min(0).values
        return {"logits": self.gpt.lm_head(h), "target_q": target_q, "v": self.v(h).squeeze(-1)}

    # ---- targets ------------------------------------------------------------------------------
    @torch.no_grad()
    def soft_update(self, alpha: float) -> None:
        """target ← alpha · online + (1 − alpha) · target, for both Q heads."""
        for online, target in zip(self.q_heads(), self.target_heads()):
            for p, tp in zip(online.parameters(), target.parameters()):
                tp.mul_(1.0 - alpha).add_(p, alpha=alpha)

    @torch.no_grad()
    def hard_update(self) -> None:
        for online, target in zip(self.q_heads(), self.target_heads()):
            target.load_state_dict(online.state_dict())

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for name, p in self.named_parameters() if not name.startswith("target_")]

    # ---- activation ---------------------------------------------------------------------------
    def _install_activation(self, name: str) -> ParamChange:
        change = ParamChange()
        for block in self.gpt.transformer.h:
            change.removed += list(block.mlp.act.parameters())
            block.mlp.act = _make_act(name)
            change.added += list(block.mlp.act.parameters())
        self.net_config["activation"] = name
        self.gpt.config.activation_function = HF_ACTIVATIONS.get(name, "gelu")
        return change

    def set_activation(self, name: str) -> ParamChange:
        make_activation(name)
        return self._install_activation(name)

    # ---- architecture -------------------------------------------------------------------------
    @property
    def n_layer(self) -> int:
        return len(self.gpt.transformer.h)

    def _renumber(self) -> None:
        for i, block in enumerate(self.gpt.transformer.h):
            block.attn.layer_idx = i
        self.gpt.config.n_layer = self.n_layer
        self.net_config["n_layer"] = self.n_layer

    def add_layer(self, position: int, generator: torch.Generator | None = None) -> ParamChange:
        """Insert an identity block at `position` (0 = first): residual output projections zero."""
        with torch.random.fork_rng(devices=[]):
            if generator is not None:
                torch.manual_seed(int(torch.randint(2**62, (1,), generator=generator)))
            block = GPT2Block(self.gpt.config, layer_idx=position)
            std = self.gpt.config.initializer_range
            for conv in (block.attn.c_attn, block.mlp.c_fc):
                nn.init.normal_(conv.weight, std=std)
                nn.init.zeros_(conv.bias)
        with torch.no_grad():
            for conv in (block.attn.c_proj, block.mlp.c_proj):
                conv.weight.zero_()
                conv.bias.zero_()
        block.mlp.act = _make_act(self.net_config["activation"])
        ref = next(self.parameters())
        block.to(device=ref.device, dtype=ref.dtype)
        block.train(self.training)
        self.gpt.transformer.h.insert(position, block)
        self._renumber()
        return ParamChange(added=list(block.parameters()))

    def remove_layer(self) -> tuple[int, ParamChange]:
        """Drop the block whose residual output projections are smallest (not function-preserving)."""
        norms = [float(b.attn.c_proj.weight.detach().norm() + b.mlp.c_proj.weight.detach().norm())
                 for b in self.gpt.transformer.h]
        i = min(range(len(norms)), key=norms.__getitem__)
        block = self.gpt.transformer.h[i]
        del self.gpt.transformer.h[i]
        self._renumber()
        return i, ParamChange(removed=list(block.parameters()))

    def widen_ff(self, extra: int, generator: torch.Generator | None = None) -> ParamChange:
        """Add `extra` feed-forward units to every block: new c_fc columns random, new c_proj rows zero."""
        change = ParamChange()
        std = self.gpt.config.initializer_range
        for block in self.gpt.transformer.h:
            fc, proj = block.mlp.c_fc, block.mlp.c_proj
            n_embd, hidden = fc.weight.shape  # Conv1D weight is (in, out)
            with torch.no_grad():
                w = torch.zeros(n_embd, hidden + extra, dtype=fc.weight.dtype)
                w[:, :hidden] = fc.weight
                w[:, hidden:] = torch.randn(n_embd, extra, generator=generator, dtype=fc.weight.dtype) * std
                b = torch.zeros(hidden + extra, dtype=fc.bias.dtype)
                b[:hidden] = fc.bias
                pw = torch.zeros(hidden + extra, n_embd, dtype=proj.weight.dtype)
                pw[:hidden] = proj.weight
            dev = fc.weight.device
            for mod, name, data, idx in ((fc, "weight", w, (slice(None), slice(0, hidden))),
                                         (fc, "bias", b, (slice(0, hidden),)),
                                         (proj, "weight", pw, (slice(0, hidden), slice(None)))):
                old = getattr(mod, name)
                new = nn.Parameter(data.to(dev))
                setattr(mod, name, new)
                change.resized.append((old, new, idx, idx))
            fc.nf = hidden + extra
        self.net_config["dim_feedfwd"] += extra
        self.gpt.config.n_inner = self.net_config["dim_feedfwd"]
        return change
