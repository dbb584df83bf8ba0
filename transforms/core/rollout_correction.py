"""Rollout correction: importance weights, rejection masks and off-policy metrics from two logprob streams.

verl's decoupled rollout correction (verl-project/verl@1dda039b9c63, `verl/trainer/ppo/rollout_corr_helper.py`
and the presets of `verl/trainer/config/algorithm.py`), recomputed offline, in float64, over one batch's
training rows: per-token IS weights (`token` or `sequence` level, truncated (TIS) or zeroed outside a band
(IcePop)), rejection masks from k1/k2/k3 statistics at token, sequence-sum, sequence-mean or sequence-max
level, and verl's `rollout_corr/*` metrics under verl's names. (The user-facing page comes with the feature.)

Tokens of all the batch's rows are flat arrays (numpy on CPU, torch on a GPU, through arrays.py), row after
row; `correct_trainable` takes only the trainable tokens' log ratios, so values at untrainable tokens are
never read. No Python loop over tokens or rows: on numpy the per-token pass loops over runs of whole rows
(BLOCK_TOKENS tokens each), reducing each run with `reduceat`s.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .arrays import arrays_for

UPSTREAM = "verl-project/verl@1dda039b9c63"
CONTRACT_VERSION = 4  # the version of docs/semantics.md that introduced it
SAFETY_BOUND = 20.0     # verl clamps log ratios to +-20 before exponentiating
BLOCK_TOKENS = 1 << 16  # tokens per run of the per-token pass (numpy): its float64 temporaries fit in cache
# verl's batch-normalisation floor and effective-sample-size guard. (Its masked means also add 1e-8 to the
# token count, but the trainer's mask is int64, and int64 + 1e-8 is taken in float32, where it vanishes
# for any count >= 1: the means here divide by the plain count.)
MEAN_EPS = 1e-8
IS_LEVELS = ("token", "sequence")
RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3", "seq_mean_k1",
              "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")
# verl's factory methods (AlgoConfig), by name: the fields each sets; thresholds as verl writes them
PRESETS: dict[str, dict] = {
    "decoupled_token_is": dict(rollout_is="token", rollout_is_threshold="2.0"),
    "decoupled_seq_is": dict(rollout_is="sequence", rollout_is_threshold="2.0"),
    "decoupled_token_icepop": dict(rollout_is="token", rollout_is_threshold="0.5_5.0"),
    "decoupled_seq_is_rs": dict(rollout_is="sequence", rollout_is_threshold="2.0", rollout_rs="seq_sum_k1",
                                rollout_rs_threshold="0.5_2.0"),
    "decoupled_geo_rs": dict(rollout_rs="seq_mean_k1", rollout_rs_threshold="0.999_1.001"),
    "decoupled_geo_rs_seq_tis": dict(rollout_is="sequence", rollout_is_threshold="2.0", rollout_rs="seq_mean_k1",
                                     rollout_rs_threshold="0.999_1.001"),
    "decoupled_geo_rs_token_tis": dict(rollout_is="token", rollout_is_threshold="2.0", rollout_rs="seq_mean_k1",
                                       rollout_rs_threshold="0.999_1.001"),
    "decoupled_k3_rs": dict(rollout_rs="seq_mean_k3", rollout_rs_threshold="0.01"),
    "decoupled_k3_rs_seq_tis": dict(rollout_is="sequence", rollout_is_threshold="2.0", rollout_rs="seq_mean_k3",
                                    rollout_rs_threshold="0.01"),
    "decoupled_k3_rs_token_tis": dict(rollout_is="token", rollout_is_threshold="2.0", rollout_rs="seq_mean_k3",
                                      rollout_rs_threshold="0.01"),
    "disabled": {},
}
# they set pi_old := pi_rollout and weigh inside the loss with the current policy: not computable offline
BYPASS_PRESETS = ("bypass_ppo_clip", "bypass_ppo_clip_geo_rs", "bypass_ppo_clip_k3_rs", "bypass_pg_is",
                  "bypass_pg_token_icepop", "bypass_pg_geo_rs", "bypass_pg_geo_rs_seq_tis",
                  "bypass_pg_geo_rs_token_tis")


def _positive(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{what}: {text!r} is not a number") from None
    if not value > 0:  # NaN too (verl lets NaN through, and then keeps or weighs nothing)
        raise ValueError(f"{what}: {text!r} must be a number > 0")
    return value


def _band(text: str, what: str) -> tuple[float, float]:
    lower, _, upper = text.partition("_")
    low, high = _positive(lower, what), _positive(upper, what)
    if low > high:
        raise ValueError(f"{what}: lower bound {lower} is above upper bound {upper}")
    return low, high


@dataclass(frozen=True)
class RsOption:
    name: str
    level: str           # token, seq_sum, seq_mean, seq_max
    kind: str            # k1, k2, k3
    lower: float | None  # k1 only: the bound on the ratio pi_rollout/pi_old
    upper: float

    @property
    def log_bounds(self) -> tuple[float | None, float]:
        """The bounds the statistic is compared with: logs for k1, the value itself for k2/k3."""
        if self.kind == "k1" and self.lower is not None:  # a k1 option always has its lower bound
            return math.log(self.lower), math.log(self.upper)
        return None, self.upper


@dataclass(frozen=True)
class CorrectionConfig:
    """The resolved options; built by `resolve`, checked when built. Thresholds stay verl's strings."""
    preset: str | None = None
    rollout_is: str | None = None
    rollout_is_threshold: str = "2.0"
    rollout_is_batch_normalize: bool = False
    rollout_rs: tuple[str, ...] = ()
    rollout_rs_threshold: str | None = None
    # derived
    is_upper: float = field(init=False, default=0.0)
    is_lower: float = field(init=False, default=0.0)   # IcePop's lower bound, else 1/U for the diagnostics
    icepop: bool = field(init=False, default=False)
    rs: tuple[RsOption, ...] = field(init=False, default=())

    def __post_init__(self):
        if self.rollout_is is not None and self.rollout_is not in IS_LEVELS:
            raise ValueError(f"--rollout-is {self.rollout_is!r}: choose token, sequence or none")
        text = str(self.rollout_is_threshold).strip()
        if isinstance(self.rollout_is_threshold, bool) or not text:
            raise ValueError(f"--rollout-is-threshold {self.rollout_is_threshold!r}: a number U or L_U")
        if "_" in text:
            low, high = _band(text, "--rollout-is-threshold")
            object.__setattr__(self, "icepop", True)
        else:
            high = _positive(text, "--rollout-is-threshold")
            low = 1.0 / high
        object.__setattr__(self, "is_upper", high)
        object.__setattr__(self, "is_lower", low)
        object.__setattr__(self, "rs", self._rs_options())

    def _rs_options(self) -> tuple[RsOption, ...]:
        names = list(dict.fromkeys(n.strip() for n in self.rollout_rs if n.strip()))
        object.__setattr__(self, "rollout_rs", tuple(names))
        if not names:
            if self.rollout_rs_threshold is not None:
                raise ValueError("--rollout-rs-threshold needs --rollout-rs")
            return ()
        unknown = [n for n in names if n not in RS_OPTIONS]
        if unknown:
            raise ValueError(f"--rollout-rs {unknown[0]!r}: choose from {', '.join(RS_OPTIONS)}")
        if self.rollout_rs_threshold is None:
            raise ValueError("--rollout-rs needs --rollout-rs-threshold")
        specs = [s.strip() for s in str(self.rollout_rs_threshold).split(",") if s.strip()]
        if not specs:
            raise ValueError("--rollout-rs-threshold is empty")
        if len(specs) == 1:
            specs = specs * len(names)
        if len(specs) != len(names):
            raise ValueError(f"--rollout-rs-threshold has {len(specs)} entries for {len(names)} --rollout-rs "
                             "options: give one for all, or one per option")
        options = []
        for name, spec in zip(names, specs):
            level, kind = name.rsplit("_", 1)
            what = f"--rollout-rs-threshold for {name}"
            if kind == "k1":
                low, high = _band(spec, what) if "_" in spec else (1.0 / _positive(spec, what), _positive(spec, what))
            else:
                if "_" in spec:
                    raise ValueError(f"{what}: {spec!r}: {kind} takes a single upper bound")
                low, high = None, _positive(spec, what)
            options.append(RsOption(name=name, level=level, kind=kind, lower=low, upper=high))
        return tuple(options)

    def record(self) -> dict:
        """What the manifest and the output metadata record."""
        return {"preset": self.preset, "rollout_is": self.rollout_is,
                "rollout_is_threshold": self.rollout_is_threshold,
                "rollout_is_batch_normalize": self.rollout_is_batch_normalize,
                "rollout_rs": ",".join(self.rollout_rs) or None,
                "rollout_rs_threshold": self.rollout_rs_threshold, "upstream": UPSTREAM}


_UNSET = object()


def resolve(preset: str | None = None, rollout_is=_UNSET, rollout_is_threshold=_UNSET,
            rollout_is_batch_normalize=_UNSET, rollout_rs=_UNSET,
            rollout_rs_threshold=_UNSET) -> CorrectionConfig | None:
    """A preset's fields, then the explicit options over them; None when the feature is off.

    `rollout_is`/`rollout_rs` take "none" to switch a preset's component off; a threshold or batch
    normalisation for a component that is off is an error, as verl would ignore it silently."""
    if preset is not None and preset not in PRESETS:
        if preset in BYPASS_PRESETS:
            raise ValueError(f"--rollout-correction {preset}: bypass presets weigh with the current policy inside "
                             "the trainer's loss; they cannot be computed offline from stored logprobs")
        raise ValueError(f"--rollout-correction {preset!r}: choose one of {', '.join(PRESETS)}")
    fields_ = dict(PRESETS[preset]) if preset is not None else {}
    explicit = {k: v for k, v in dict(rollout_is=rollout_is, rollout_is_threshold=rollout_is_threshold,
                                      rollout_is_batch_normalize=rollout_is_batch_normalize, rollout_rs=rollout_rs,
                                      rollout_rs_threshold=rollout_rs_threshold).items() if v is not _UNSET}
    fields_.update(explicit)
    if fields_.get("rollout_is") == "none":
        fields_["rollout_is"] = None
        if "rollout_is_threshold" not in explicit:  # the preset's threshold goes with its weights
            fields_.pop("rollout_is_threshold", None)
    rs = fields_.get("rollout_rs")
    if rs in (None, "none", "", ()):
        fields_["rollout_rs"] = ()
        if "rollout_rs_threshold" not in explicit:
            fields_.pop("rollout_rs_threshold", None)
    elif isinstance(rs, str):
        fields_["rollout_rs"] = tuple(rs.split(","))
    if preset is None and fields_.get("rollout_is") is None and not fields_["rollout_rs"]:
        if any(k in explicit for k in ("rollout_is_threshold", "rollout_rs_threshold")) \
                or explicit.get("rollout_is_batch_normalize"):
            raise ValueError("a rollout-correction threshold or --rollout-is-batch-normalize needs --rollout-is, "
                             "--rollout-rs or --rollout-correction")
        return None
    if fields_.get("rollout_is") is None:
        if "rollout_is_threshold" in explicit:
            raise ValueError("--rollout-is-threshold needs --rollout-is token|sequence")
        if fields_.get("rollout_is_batch_normalize"):
            raise ValueError("--rollout-is-batch-normalize needs --rollout-is token|sequence")
    return CorrectionConfig(preset=preset, **fields_)


@dataclass
class Correction:
    weights: object      # float64 per token: the IS weights (0 at untrainable tokens); None without rollout_is
    mask: object         # bool per token: the training mask after rejection
    rejected: object     # bool per row
    metrics: dict | None  # {"rollout_corr/<name>": float or None}; None for a batch with no trainable token


class Layout:
    """Where a batch's trainable tokens lie among all its tokens: each row's token count and, per token,
    whether it trains. With it, `correct_trainable` gives its weights and keep flags per token of the layout
    (0 and False at the untrainable ones), written in place run by run, instead of per trainable token."""

    def __init__(self, xp, lengths, trains):
        self.trains = trains
        self.rows = xp.segments(lengths)
        self.offsets = xp.cumsum(lengths) - lengths
        self.every = bool(trains.all())

    @property
    def total(self) -> int:
        return int(self.trains.shape[0])

    def place(self, out, row_range: slice, values) -> None:
        """values (one per trainable token of the rows in row_range) at their tokens in out."""
        start = int(self.offsets[row_range.start])
        stop = int(self.offsets[row_range.stop - 1]) + int(self.rows.counts[row_range.stop - 1])
        if self.every:
            out[start:stop] = values
        else:
            out[start:stop][self.trains[start:stop]] = values

    def spread(self, per_row, untrainable):
        """Each row's value at each of its trainable tokens, `untrainable` at the others."""
        values = self.rows.spread(per_row)
        if not self.every:
            values[~self.trains] = untrainable
        return values


@dataclass
class Trained:
    """`correct_trainable`'s result: per token of the layout when one was given, else per trainable token
    (row after row)."""
    weights: object      # float64 (or the dtype asked for) per token; None without rollout_is
    keep: object         # bool per token after rejection; None when no token is rejected
    rejected: object     # bool per row
    dropped: object      # int64 per row: its tokens rejected
    metrics: dict | None


def correct(row, n_rows: int, mask, old, rollout, config: CorrectionConfig) -> Correction:
    """One batch: `row` (int64 per token, non-decreasing), `mask` (bool per token, the training mask before
    correction), `old`/`rollout` (float64 per token: pi_old's and the rollout engine's logprobs)."""
    xp = arrays_for(row)
    with xp.non_finite_allowed():
        # values at untrainable tokens are never read: everything works on the trainable ones only
        rows = xp.segments(xp.count(row[mask], n_rows))
        old_t, rollout_t = old[mask], rollout[mask]
        layout = Layout(xp, xp.count(row, n_rows), mask)
        trained = correct_trainable(rows, old_t - rollout_t, rows.sum(old_t), rows.sum(rollout_t), config,
                                    layout=layout)
    return Correction(weights=trained.weights, mask=mask if trained.keep is None else trained.keep,
                      rejected=trained.rejected, metrics=trained.metrics)


def correct_trainable(rows, log_ratio, old_sum, rollout_sum, config: CorrectionConfig,
                      weights_dtype: str = "float64", layout: Layout | None = None) -> Trained:
    """One batch from its trainable tokens: `rows` (xp.segments: how many trainable tokens each row has; the
    tokens lie row after row), `log_ratio` (float64 per trainable token: log pi_old - log pi_rollout; not
    written to) and each row's sums of both streams' logprobs over its trainable tokens (float64 per row).
    The weights come as `weights_dtype` (the arithmetic is float64 either way); with a `layout`, the
    weights and keep flags come per token of the layout."""
    xp = arrays_for(log_ratio)
    with xp.non_finite_allowed():
        nothing = xp.zeros(rows.n, "int64")
        if rows.total == 0:  # verl raises here; the batch is written as it is
            weights = xp.zeros(layout.total if layout else 0, weights_dtype) if config.rollout_is else None
            return Trained(weights=weights, keep=None, rejected=nothing > 0, dropped=nothing, metrics=None)
        b = _Batch(xp, rows, log_ratio, config, weights_dtype, layout)
        metrics = _offpolicy_metrics(xp, b, old_sum, rollout_sum)
        weights = None
        if config.rollout_is:
            weights, is_metrics = _is_weights(xp, b, config, weights_dtype)
            metrics.update(is_metrics)
        keep, rejected, dropped = None, nothing > 0, nothing
        if config.rs:
            keep, rejected, dropped, rs_metrics = _rejection(xp, b, config)
            metrics.update(rs_metrics)
    return Trained(weights=weights, keep=keep, rejected=rejected, dropped=dropped, metrics=_finite(metrics))


class _Batch:
    """The batch's trainable tokens and what every metric is made of, each computed once.

    Memory traffic is the cost here, so the per-token work is one pass over the log ratio, a run of rows
    (about BLOCK_TOKENS tokens) at a time, each run's temporaries small and reused: it clamps the log ratio to
    +-20 (only where it leaves that band), takes its exponential (the token-level IS ratio) once, makes the
    token IS weights from it, and leaves per-row sums (`reduceat`s, arrays.py's segments) and batch totals.
    A mean over tokens is taken from per-row sums; a metric over a per-row value spread to every token of
    its row is computed per row, weighted by the row's token count."""

    def __init__(self, xp, rows, log_ratio, config: CorrectionConfig, weights_dtype: str, layout):
        self.xp, self.rows, self.n_rows, self.layout = xp, rows, rows.n, layout
        self.total = float(rows.total)
        self.tokens = xp.astype(rows.counts, "float64")
        self.valid = self.tokens > 0
        self.log_ratio = log_ratio
        self.in_band = bool(float(log_ratio.min()) >= -SAFETY_BOUND and float(log_ratio.max()) <= SAFETY_BOUND)
        self.seq_sum = xp.zeros(rows.n, "float64")  # unclamped per token, 0 for a row without a trainable token
        self.safe_sum = self.seq_sum if self.in_band else xp.zeros(rows.n, "float64")
        self.k3_sum = xp.zeros(rows.n, "float64")  # verl's k3 of the clamped log ratio s: exp(s) - 1 - s
        self.ratio_squares = 0.0
        self.token_is = (_TokenWeights(xp, rows, config, _stored(config, weights_dtype), layout)
                         if config.rollout_is == "token" else None)
        for tokens, row_range, part in rows.blocks(BLOCK_TOKENS):
            x = log_ratio[tokens]
            safe = x if self.in_band else xp.clip(x, -SAFETY_BOUND, SAFETY_BOUND)
            ratio = xp.exp(safe)
            self.seq_sum[row_range] = part.sum(x)
            if not self.in_band:
                self.safe_sum[row_range] = part.sum(safe)
            self.ratio_squares += xp.dot(ratio, ratio)
            k3 = ratio - 1.0
            k3 -= safe
            self.k3_sum[row_range] = part.sum(k3)
            if self.token_is is not None:
                self.token_is.add(tokens, row_range, part, ratio)  # takes ratio
        self._safe = self._k3 = None

    @property
    def k3(self):
        """verl's k3 per token (for the token-level and max statistics only)."""
        if self._k3 is None:
            self._k3 = self.xp.exp(self.safe) - 1.0
            self._k3 -= self.safe
        return self._k3

    @property
    def safe(self):
        """The clamped log ratio per token (for the token-level and max statistics only)."""
        if self._safe is None:
            self._safe = self.log_ratio if self.in_band else self.xp.clip(self.log_ratio, -SAFETY_BOUND,
                                                                          SAFETY_BOUND)
        return self._safe

    def tmean(self, x) -> float:
        """Mean over every trainable token of the batch."""
        return float(x.sum()) / self.total

    def share(self, flags) -> float:
        """The share of the batch's trainable tokens whose flag is set."""
        return self.xp.count_nonzero(flags) / self.total

    def spread_mean(self, per_row) -> float:
        """tmean of a per-row value spread to each token of its row."""
        return self.xp.dot(self.tokens, self.xp.astype(per_row, "float64")) / self.total

    def rmean(self, x):
        """Per row: the mean over its trainable tokens, 0 for a row with none."""
        return self.per_row_mean(self.rows.sum(x))

    def per_row_mean(self, sums):
        return self.xp.where(self.valid, sums / self.xp.clip(self.tokens, 1.0),
                             self.xp.zeros(self.n_rows, "float64"))

    def row_max(self, x):
        """Per row: the max over its trainable tokens, 0 for a row with none."""
        return self.xp.where(self.valid, self.rows.max(x), self.xp.zeros(self.n_rows, "float64"))

    def population_std(self, sum_: float, sum_of_squares: float) -> float:
        """verl's one-pass population std over the trainable tokens, sqrt(E[c^2] - E[c]^2), from the sums of
        c and of c^2; 0 for a batch of at most one token."""
        if self.total <= 1:
            return 0.0
        mean = sum_ / self.total
        return math.sqrt(max(0.0, sum_of_squares / self.total - mean * mean))

    def token_std(self, c) -> float:
        return self.population_std(float(c.sum()), self.xp.dot(c, c))

    def spread_std(self, per_row) -> float:
        """population_std of a per-row value spread to each token of its row."""
        weighted = self.tokens * per_row
        return self.population_std(float(weighted.sum()), self.xp.dot(weighted, per_row))


class _TokenWeights:
    """Token-level IS weights, made run by run from the ratio, and what their metrics need: the ratio's
    extremes, how many ratios lie above U and below L, and the per-row sums of ratios and of weights."""

    def __init__(self, xp, rows, config: CorrectionConfig, dtype: str, layout):
        self.xp, self.upper, self.lower, self.icepop = xp, config.is_upper, config.is_lower, config.icepop
        self.layout = layout
        self.weights = xp.zeros(layout.total if layout else rows.total, dtype)
        self.raw_sum, self.weight_sum = xp.zeros(rows.n, "float64"), xp.zeros(rows.n, "float64")
        self.raw_max, self.raw_min, self.weight_max, self.weight_min = -math.inf, math.inf, -math.inf, math.inf
        self.high = self.low = 0
        self.weight_squares = 0.0

    def add(self, tokens, row_range, part, ratio):
        xp, upper, lower = self.xp, self.upper, self.lower
        top, bottom = float(ratio.max()), float(ratio.min())
        self.raw_max, self.raw_min = max(self.raw_max, top), min(self.raw_min, bottom)
        high = xp.count_nonzero(ratio > upper) if top > upper else 0
        low = xp.count_nonzero(ratio < lower) if bottom < lower else 0
        self.high, self.low = self.high + high, self.low + low
        sums = part.sum(ratio)
        self.raw_sum[row_range] = sums
        weights = ratio  # in place: TIS truncates at U, IcePop zeroes outside [L, U]
        if self.icepop and (high or low):
            weights[(ratio < lower) | (ratio > upper)] = 0.0
            sums, top, bottom = part.sum(weights), float(weights.max()), float(weights.min())
        elif not self.icepop and high:
            weights = xp.minimum_(ratio, upper)
            sums, top, bottom = part.sum(weights), upper, min(bottom, upper)
        self.weight_sum[row_range] = sums
        self.weight_max, self.weight_min = max(self.weight_max, top), min(self.weight_min, bottom)
        self.weight_squares += xp.dot(weights, weights)
        if self.layout is None:
            self.weights[tokens] = weights
        else:
            self.layout.place(self.weights, row_range, weights)


def _share(flags) -> float:
    n = int(flags.shape[0])
    return float(flags.sum()) / n if n else 0.0


def _sample_std(values) -> float:
    n = int(values.shape[0])
    if n < 2:
        return 0.0
    mean = float(values.sum()) / n
    return math.sqrt(float(((values - mean) ** 2).sum()) / (n - 1))


def _finite(metrics: dict) -> dict:
    return {f"rollout_corr/{k}": (float(v) if math.isfinite(v) else None) for k, v in metrics.items()}


def _offpolicy_metrics(xp, b: _Batch, old_sum, rollout_sum) -> dict:
    a, r = b.per_row_mean(old_sum), b.per_row_mean(rollout_sum)
    d = r - a
    seq_chi = xp.exp(2.0 * xp.clip(b.seq_sum, -SAFETY_BOUND, SAFETY_BOUND))
    if b.in_band:  # the unclamped k3 is the clamped one
        k3_kl = float(b.k3_sum.sum()) / b.total
    else:
        k3_kl = b.tmean(xp.exp(b.log_ratio) - b.log_ratio - 1.0)
    mean = _mean_rows
    return {
        "training_ppl": mean(xp.exp(-a)), "training_log_ppl": mean(-a),
        "kl": -float(b.seq_sum.sum()) / b.total,  # the mean of log pi_rollout - log pi_old
        "k3_kl": k3_kl,
        "rollout_ppl": mean(xp.exp(-r)), "rollout_log_ppl": mean(-r),
        "log_ppl_diff": mean(d), "log_ppl_abs_diff": mean(xp.abs(d)),
        "log_ppl_diff_max": float(d.max()), "log_ppl_diff_min": float(d.min()),
        "ppl_ratio": mean(xp.exp(d)),
        "chi2_token": b.ratio_squares / b.total - 1.0,
        "chi2_seq": mean(seq_chi) - 1.0,
    }


def _exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _mean_rows(values) -> float:
    return float(values.sum()) / int(values.shape[0])


def _is_weights(xp, b: _Batch, config: CorrectionConfig, weights_dtype: str):
    """The IS weights per trainable token and their metrics. Every weight lies in [0, upper] (the ratio is
    positive; TIS truncates at upper, IcePop zeroes outside its band), so verl's clamp of the weights to
    [0, upper] for their std and effective sample size changes nothing and is not taken."""
    if b.token_is is not None:
        weights, m = _token_is_weights(b, b.token_is, config)
    else:
        weights, m = _sequence_is_weights(xp, b, config, _stored(config, weights_dtype))
    return xp.astype(weights, weights_dtype), m


def _stored(config: CorrectionConfig, weights_dtype: str) -> str:
    """The dtype the weights are made in: float64 when they are divided by their mean afterwards (rounded
    once, after the division)."""
    return "float64" if config.rollout_is_batch_normalize else weights_dtype


def _token_is_weights(b: _Batch, w: _TokenWeights, config: CorrectionConfig):
    total_weight = float(w.weight_sum.sum())
    m = {"rollout_is_mean": total_weight / b.total, "rollout_is_max": w.weight_max, "rollout_is_min": w.weight_min,
         "rollout_is_ratio_fraction_high": w.high / b.total, "rollout_is_ratio_fraction_low": w.low / b.total}
    m.update(_is_spread(b, total_weight, w.weight_squares, b.per_row_mean(w.weight_sum),
                        b.per_row_mean(w.raw_sum), config))
    if config.icepop:
        m["rollout_is_oob_ratio"] = (w.high + w.low) / b.total
    weights = w.weights
    if config.rollout_is_batch_normalize:
        weights, m["rollout_is_batch_norm_factor"] = _normalized(weights, m["rollout_is_mean"])
    return weights, m


def _sequence_is_weights(xp, b: _Batch, config: CorrectionConfig, weights_dtype: str):
    upper, lower = config.is_upper, config.is_lower
    raw = xp.exp(xp.clip(b.seq_sum, -SAFETY_BOUND, SAFETY_BOUND))  # per row
    if config.icepop:
        per_row = xp.where((raw >= lower) & (raw <= upper), raw, xp.zeros(b.n_rows, "float64"))
    else:
        per_row = xp.clip(raw, None, upper)
    zeros = xp.zeros(b.n_rows, "float64")
    q, p = xp.where(b.valid, per_row, zeros), xp.where(b.valid, raw, zeros)  # a row's mean of its one value
    weighted = b.tokens * per_row
    total_weight = float(weighted.sum())
    seq_sum = b.seq_sum
    m = {"rollout_is_mean": total_weight / b.total,
         "rollout_is_max": math.exp(min(float(seq_sum.max()), SAFETY_BOUND)),
         "rollout_is_min": _exp(float(seq_sum.min())),  # unclamped, as verl
         "rollout_is_ratio_fraction_high": _share(seq_sum > math.log(upper)),
         "rollout_is_ratio_fraction_low": _share(seq_sum < math.log(lower))}
    m.update(_is_spread(b, total_weight, xp.dot(weighted, per_row), q, p, config))
    if config.icepop:
        outside = (raw < lower) | (raw > upper)
        m["rollout_is_oob_ratio"] = xp.dot(b.tokens, xp.astype(outside, "float64")) / b.total
    per_row = xp.astype(per_row, weights_dtype)
    weights = b.rows.spread(per_row) if b.layout is None else b.layout.spread(per_row, 0.0)
    if config.rollout_is_batch_normalize:
        norm = float(q[b.valid].sum()) / max(int(b.valid.sum()), MEAN_EPS)
        weights, m["rollout_is_batch_norm_factor"] = _normalized(weights, norm)
    return weights, m


def _is_spread(b: _Batch, total_weight: float, squares: float, q, p, config: CorrectionConfig) -> dict:
    """The metrics of the weights' spread: from their sum and sum of squares over the trainable tokens, q (each
    row's mean weight) and p (each row's mean raw ratio)."""
    upper, lower = config.is_upper, config.is_lower
    mean = total_weight / b.total
    # sum((c / (mean + eps))^2) / n; 0 when IcePop zeroes every weight (verl raises)
    spread = squares / b.total / (mean + MEAN_EPS) ** 2
    return {
        "rollout_is_std": b.population_std(total_weight, squares),
        "rollout_is_eff_sample_size": 1.0 / spread if spread > 0 else math.inf,
        "rollout_is_seq_mean": _mean_rows(q),
        "rollout_is_seq_std": _sample_std(q),
        "rollout_is_seq_max": float(q.max()), "rollout_is_seq_min": float(q.min()),
        "rollout_is_seq_max_deviation": float(b.xp.abs(q - 1.0).max()),
        "rollout_is_seq_fraction_high": _share(p > upper),
        "rollout_is_seq_fraction_low": _share(p < lower),
    }


def _normalized(weights, norm: float):
    """verl's batch normalisation: the weights over their mean, unless the mean is below its floor."""
    if norm > MEAN_EPS:
        weights /= norm
        return weights, norm
    return weights, 1.0


def _token_statistic(b: _Batch, kind):
    if kind == "k1":
        return -b.safe
    if kind == "k2":
        return 0.5 * b.safe * b.safe
    return b.k3


def _row_statistic(b: _Batch, option: RsOption):
    """A sequence-level option's value per row (0 for a row without a trainable token)."""
    if option.level == "seq_max":
        return b.row_max(_token_statistic(b, option.kind))
    if option.kind == "k1":  # the sum of -s is minus the sum of s, exactly
        sums = -b.safe_sum
    elif option.kind == "k3":
        sums = b.k3_sum
    else:
        sums = b.rows.sum(_token_statistic(b, option.kind))
    return sums if option.level == "seq_sum" else b.per_row_mean(sums)


def _rejection(xp, b: _Batch, config: CorrectionConfig):
    """Each option's keep flags and its metrics; returns the keep flags of all options together per
    trainable token (None when none is rejected), the rejected rows, each row's rejected tokens and the
    metrics. A sequence-level option decides per row: its flags, counts and std are computed per row,
    weighted by the row's token count."""
    keep_rows = b.valid | True  # the sequence-level options' verdict per row
    by_rows = False             # whether a sequence-level option decided any
    keep_tokens = None          # the token-level options' verdict per token
    metrics: dict = {}
    valid_rows = int(b.valid.sum())
    for option in config.rs:
        low, high = option.log_bounds
        if option.level == "token":
            stat = _token_statistic(b, option.kind)
            keep = stat <= high if low is None else (stat >= low) & (stat <= high)
            keep_tokens = keep if keep_tokens is None else keep_tokens & keep
            m, rejected_row = _token_option_metrics(xp, b, stat, keep, low, high)
        else:
            per_row = _row_statistic(b, option)
            keep = per_row <= high if low is None else (per_row >= low) & (per_row <= high)
            keep_rows, by_rows = keep_rows & keep, True
            m, rejected_row = _row_option_metrics(xp, b, per_row, keep, low, high)
        m["seq_masked_fraction"] = float(rejected_row[b.valid].sum()) / valid_rows
        metrics.update({f"rollout_rs_{option.name}_{k}": v_ for k, v_ in m.items()})
    if keep_tokens is None:
        rejected = b.valid & ~keep_rows
        dropped = xp.where(rejected, b.rows.counts, xp.zeros(b.n_rows, "int64"))
        keep = None
        if bool(rejected.any()):
            keep = b.rows.spread(keep_rows) if b.layout is None else b.layout.spread(keep_rows, False)
    else:
        keep = keep_tokens & b.rows.spread(keep_rows) if by_rows else keep_tokens
        dropped = b.rows.sum(~keep, "int64")
        rejected = dropped > 0
        if b.layout is not None:
            keep = _placed(b, keep)
    metrics["rollout_rs_masked_fraction"] = float(dropped.sum()) / b.total
    metrics["rollout_rs_seq_masked_fraction"] = _share(rejected)
    return keep, rejected, dropped, metrics


def _placed(b: _Batch, keep):
    """Keep flags per trainable token, at their tokens of the layout (False at the others)."""
    out = b.xp.zeros(b.layout.total, "bool")
    out[b.layout.trains] = keep
    return out


def _token_option_metrics(xp, b: _Batch, z, keep, low, high):
    v = b.rmean(z)[b.valid]
    m = {"mean": b.tmean(z), "max": float(z.max()), "min": float(z.min()),
         "fraction_high": b.share(z > high), "fraction_low": b.share(z < low) if low is not None else 0.0,
         "std": b.token_std(xp.clip(z, low if low is not None else 0.0, high))}
    m.update(_seq_values(xp, v, low, high))
    m["masked_fraction"] = (b.total - xp.count_nonzero(keep)) / b.total
    return m, b.rows.any(~keep)


def _row_option_metrics(xp, b: _Batch, per_row, keep, low, high):
    """A sequence-level option: per_row is its value at each token of the row."""
    v = per_row[b.valid]
    m = {"mean": b.spread_mean(per_row), "max": float(v.max()), "min": float(v.min()),
         "fraction_high": _share(v > high), "fraction_low": _share(v < low) if low is not None else 0.0,
         "std": b.spread_std(xp.clip(per_row, low if low is not None else 0.0, high))}
    m.update(_seq_values(xp, v, low, high))
    rejected_row = b.valid & ~keep
    m["masked_fraction"] = xp.dot(b.tokens, xp.astype(rejected_row, "float64")) / b.total
    return m, rejected_row


def _seq_values(xp, v, low, high) -> dict:
    m = {"seq_mean": _mean_rows(v), "seq_std": _sample_std(v),
         "seq_max": float(v.max()), "seq_min": float(v.min()), "seq_max_deviation": float(xp.abs(v).max()),
         "seq_fraction_high": _share(v > high)}
    if low is not None:
        m["seq_fraction_low"] = _share(v < low)
    return m
