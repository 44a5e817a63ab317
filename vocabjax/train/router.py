"""`python -m vocabjax.train.router --config configs/train/router_*.yaml`: fit DynaSpec's token
clusters and train its router (`vocabjax.vocab.clustered`).

Letters: X label positions (rows), D drafter hidden size, V vocabulary, C clusters.

Data: the ranker's feature shards (`vocabjax.train.features`: the drafter's final hidden states
and the target's next tokens at every completion position, built once into `<out>/features` or
shared through `features`). Clusters: balanced k-means of the drafter's normalized LM-head rows
(`fit_clusters`, numpy; `<out>/clusters.npy`, reused by a rerun of the same job). Router: one
linear layer h -> [C], softmax cross-entropy of the cluster of the target's next token, AdamW
with warmup + cosine (`vocabjax.train.loop`), orbax checkpoints every `checkpoint_every` steps
(rerun to resume), held-out loss and the share of labels whose cluster is among the router's
top m (`recall@m`, for each m of `recall_top`) every `eval_every` steps (`log.jsonl`,
`curves.png`). Output: `router.safetensors` (with the drafter's identity), `summary.json`.

An EAGLE head over the target's whole vocabulary as the drafter (the papers' setting):
`eagle_head` names the head, `eagle_features` the target features it was trained on, `drafter`
its target. The rows are then the head's normed depth-0 outputs with the target's next tokens,
the very rows a SpecVocab ranker for that head trains on (`vocabjax.train.ranker`'s
`build_head_features`; `features` may share a ranker job's directory), the clusters are of
the head's LM-head rows (the target's), and the router carries the head's identity, so it
attaches to that head (`--method eagle --set vocab=dynaspec:router=...`) and no other drafter.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from vocabjax.checkpoints.loader import load_model
from vocabjax.io import atomic_write_bytes, atomic_write_json
from vocabjax.models.llamalike import lm_head_weight
from vocabjax.train.features import (FeatureSpec, build_features, heldout_records,
                                     load_features, model_identity)
from vocabjax.train.ranker import (RankerJob, build_head_features, head_drafter_identity,
                                   load_head)
from vocabjax.train.loop import (OptimConfig, TrainError, TrainRun, TrainState, apply_grads,
                                 check_settings, job_fields, make_optimizer, optimizer_of,
                                 progress, run_job_cli, step_rng, train_fingerprint)
from vocabjax.vocab.clustered import ClusterRouter, RouterError, fit_clusters, router_scores


@dataclasses.dataclass(frozen=True)
class RouterJob:
  drafter: str  # registry name or path of the drafter
  data: tuple[str, ...]  # completion jsonl files
  out: str  # output directory
  target: str | None = None  # teacher for labels (None: the text's next tokens)
  clusters: int = 64  # C
  cluster_iters: int = 8  # k-means iterations
  steps: int = 1000
  batch_tokens: int = 512
  lr: float = 3e-3
  warmup_steps: int = 50
  weight_decay: float = 0.0
  clip_norm: float = 1.0
  heldout: float = 0.1
  eval_every: int = 100
  checkpoint_every: int = 100
  recall_top: tuple[int, ...] = (1, 2, 4, 8)
  seed: int = 0
  max_records: int | None = None
  features: str | None = None  # default <out>/features (a ranker job's may be shared)
  # an EAGLE head over the target's full vocabulary as the drafter (module doc); `drafter` is
  # then its target, `eagle_features` the target features the head was trained on
  eagle_head: str | None = None
  eagle_features: str | tuple[str, ...] | None = None

  def __post_init__(self):
    check_settings(self)
    if self.clusters < 1:
      raise TrainError(f"clusters={self.clusters}: a router needs at least one cluster")
    if self.cluster_iters < 1:
      raise TrainError(f"cluster_iters={self.cluster_iters} must be >= 1")
    if not 0 < self.heldout < 1:
      raise TrainError(f"heldout={self.heldout} must be in (0, 1)")
    if not self.data:
      raise TrainError("no data files given")
    if isinstance(self.eagle_features, list):
      object.__setattr__(self, "eagle_features", tuple(self.eagle_features))
    if (self.eagle_head is None) != (self.eagle_features is None):
      raise TrainError("eagle_head and eagle_features go together: the head and the target "
                       "features it was trained on")
    if self.eagle_head is not None and self.target is not None:
      raise TrainError(f"a head's router trains on the target's tokens stored in its features "
                       f"(target: null); got target={self.target!r}")
    if any(m < 1 or m > self.clusters for m in self.recall_top):
      raise TrainError(f"recall_top={self.recall_top} must lie in [1, clusters="
                       f"{self.clusters}]")

  @property
  def feature_spec(self) -> FeatureSpec:
    return FeatureSpec(drafter=self.drafter, data=self.data,
                       directory=str(Path(self.features) if self.features
                                     else Path(self.out) / "features"),
                       target=self.target, max_records=self.max_records)

  def head_job(self):
    """The ranker job whose head features this router reads (same drafter, data, head,
    target features and feature directory: `build_head_features` computes them)."""
    return RankerJob(drafter=self.drafter, data=self.data, out=self.out,
                     features=self.feature_spec.directory, max_records=self.max_records,
                     eagle_head=self.eagle_head, eagle_features=self.eagle_features)

  def train_fingerprint(self) -> str:
    data = (self.head_job().head_feature_fingerprint() if self.eagle_head
            else self.feature_spec.fingerprint())
    return train_fingerprint(self, replace={"data": data},
                             new_defaults={"eagle_head": None, "eagle_features": None})


def job_from_dict(raw: dict, *, where: str = "config") -> RouterJob:
  return RouterJob(**job_fields(raw, RouterJob, ("drafter", "data", "out"), where=where,
                                tuples=("recall_top",)))


def router_loss(params: dict, h: jax.Array, clusters: jax.Array) -> jax.Array:
  """Mean softmax cross-entropy of the label's cluster: h [X, D], clusters [X]."""
  s = router_scores(params, h)
  return optax.softmax_cross_entropy_with_integer_labels(s, clusters).mean()


def cluster_recall(params: dict, h, clusters, tops) -> dict:
  """The share of rows whose label's cluster is among the router's top m, for each m."""
  s = np.asarray(router_scores(params, jnp.asarray(h)))
  rank = (s > s[np.arange(len(s)), np.asarray(clusters)][:, None]).sum(1)
  return {f"recall@{m}": float(np.mean(rank < m)) for m in tops}


def _clusters(job: RouterJob, U, out: Path, show_progress: bool) -> np.ndarray:
  """The job's k-means clusters, fitted once and kept beside its outputs."""
  path = out / f"clusters-{job.train_fingerprint()}.npy"
  if path.exists():
    return np.load(path)
  bar = progress(range(job.cluster_iters), desc=f"k-means C={job.clusters}") if (
      show_progress) else None
  members = fit_clusters(U, job.clusters, iters=job.cluster_iters, seed=job.seed,
                         progress=(lambda it: bar.update(1)) if bar is not None else None)
  if bar is not None:
    bar.close()
  import io

  buf = io.BytesIO()
  np.save(buf, members)
  atomic_write_bytes(path, buf.getvalue())
  return members


def train(job: RouterJob, *, show_progress: bool = True, stop_after: int | None = None) -> dict:
  """Build features if needed, fit the clusters, train the router (resuming), export."""
  out = Path(job.out)
  out.mkdir(parents=True, exist_ok=True)
  if job.eagle_head:
    hjob = job.head_job()
    draft = load_model(job.drafter, dtype="float32", progress=show_progress)
    hc, head = load_head(hjob, draft)
    fdir = build_head_features(hjob, draft, (hc, head), show_progress=show_progress)
    identity = head_drafter_identity(draft, head)
    U = np.asarray(head["lm_head"])  # the head's LM head: the target's rows, full V
  else:
    fdir = build_features(job.feature_spec, show_progress=show_progress)
    draft = load_model(job.drafter, dtype="float32", progress=show_progress)
    identity = model_identity(draft)
    U = np.asarray(lm_head_weight(draft.params, draft.config))
  feats = load_features(fdir)
  if feats.meta["drafter"]["fingerprint"] != identity["fingerprint"]:
    raise TrainError(f"features in {fdir} were made with another drafter")
  V, D = U.shape
  if job.clusters > V:
    raise RouterError(f"clusters={job.clusters} exceeds the vocabulary of V={V} tokens")
  members = _clusters(job, U, out, show_progress)
  cluster_of = np.empty(V, np.int32)
  c, j = np.nonzero(members >= 0)
  cluster_of[members[c, j]] = c
  held_mask = np.isin(feats.record, heldout_records(feats, job.heldout))
  held, rows = feats.rows(held_mask), feats.rows(~held_mask)
  if not len(rows["label"]) or not len(held["label"]):
    raise TrainError(f"empty train ({len(rows['label'])}) or held-out ({len(held['label'])}) "
                     f"rows")
  optim = OptimConfig(lr=job.lr, warmup_steps=job.warmup_steps, total_steps=job.steps,
                      weight_decay=job.weight_decay, clip_norm=job.clip_norm)
  hyper = optim.array()
  params = {"weight": jnp.zeros((job.clusters, D), jnp.float32),
            "bias": jnp.asarray(np.log(np.maximum(np.bincount(
                cluster_of[rows["label"]], minlength=job.clusters), 1)), jnp.float32)}
  run = TrainRun(out, job.train_fingerprint(), steps=job.steps, eval_every=job.eval_every,
                 checkpoint_every=job.checkpoint_every, what="train.router",
                 job=dataclasses.asdict(job))
  state = run.restore(TrainState.create(params, make_optimizer(optim)))
  h_tr, c_tr = jnp.asarray(rows["hidden"]), jnp.asarray(cluster_of[rows["label"]])
  h_he, c_he = jnp.asarray(held["hidden"]), jnp.asarray(cluster_of[held["label"]])

  @jax.jit
  def step(st, sel, hyper):
    loss, grads = jax.value_and_grad(router_loss)(st.params, h_tr[sel], c_tr[sel])
    return apply_grads(st, grads, optimizer_of(hyper)), loss

  held_loss = jax.jit(router_loss)
  n = len(rows["label"])

  def step_fn(st, k):
    st, loss = step(st, jnp.asarray(step_rng(job.seed, k).randint(0, n, job.batch_tokens)),
                    hyper)
    return st, {"loss": loss}

  def evaluate(st, k):
    return {"heldout_loss": float(held_loss(st.params, h_he, c_he)),
            **cluster_recall(st.params, h_he, c_he, job.recall_top)}

  res = run.fit(state, step_fn, evaluate, stop_after=stop_after,
                desc=f"router C={job.clusters}", show_progress=show_progress)
  run.plot(["train_loss", "heldout_loss", *[f"recall@{m}" for m in job.recall_top]],
           f"DynaSpec router, C={job.clusters}")
  final = res.rows[-1] if res.rows else None
  summary = {"job": dataclasses.asdict(job), "steps_done": res.end,
             "complete": res.end == job.steps, "train_rows": n,
             "heldout_rows": int(len(held["label"])), "cluster_size": int(members.shape[1]),
             "final": final}
  if res.end == job.steps:
    p = res.state.params
    ClusterRouter(members, np.asarray(p["weight"]), np.asarray(p["bias"]), identity,
                  meta={"job": job.train_fingerprint(), "final": final}).save(
                      out / "router.safetensors")
    summary["exported"] = str(out / "router.safetensors")
  atomic_write_json(out / "summary.json", summary)
  return summary


def main(argv=None) -> int:
  return run_job_cli(argv, prog="python -m vocabjax.train.router", doc=__doc__,
                     configs="configs/train/router_*.yaml", what="router",
                     job_from_dict=job_from_dict, train=train,
                     errors=(TrainError, RouterError, ValueError, FileNotFoundError))


if __name__ == "__main__":
  sys.exit(main())
