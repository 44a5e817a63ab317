"""The training driver: its optimizer (schedule and traced numbers), and Ctrl-C: the step under
way finishes, a checkpoint is written, one line says where, and the rerun resumes exactly there."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from vocabjax import interrupt
from vocabjax.train.loop import (OptimConfig, TrainInterrupted, TrainRun, TrainState,
                                 apply_grads, make_optimizer, optimizer_of, schedule)


@pytest.mark.parametrize("cfg", [OptimConfig(lr=3e-3, warmup_steps=4, total_steps=40),
                                 OptimConfig(lr=1e-2, warmup_steps=0, total_steps=7,
                                             end_lr_ratio=0.0),
                                 OptimConfig(lr=2e-4, warmup_steps=10, total_steps=10)])
def test_schedule_is_optaxs_warmup_cosine_decay(cfg):
  steps = np.arange(0, cfg.total_steps + 5)
  ours = np.asarray(jax.vmap(schedule(cfg))(jnp.asarray(steps)))
  if cfg.warmup_steps < cfg.total_steps:
    ref = optax.warmup_cosine_decay_schedule(
        0.0, cfg.lr, cfg.warmup_steps, cfg.total_steps, cfg.lr * cfg.end_lr_ratio)
    want = np.asarray([ref(s) for s in steps])
  else:  # optax refuses a decay over 0 steps: warmup to the peak, then the end value
    want = np.where(steps < cfg.warmup_steps, cfg.lr * steps / cfg.warmup_steps,
                    np.where(steps == cfg.warmup_steps, cfg.lr, cfg.lr * cfg.end_lr_ratio))
  np.testing.assert_allclose(ours, want, rtol=1e-6, atol=1e-12)
  assert ours[cfg.warmup_steps] == pytest.approx(cfg.lr, rel=1e-6)


def test_traced_numbers_update_as_constants_do_and_share_one_program():
  """`optimizer_of(cfg.array())` inside a jitted step makes `make_optimizer(cfg)`'s updates,
  and two jobs differing only in their numbers run one compiled program."""
  rs = np.random.RandomState(0)
  params = {"w": jnp.asarray(rs.randn(5), jnp.float32), "b": jnp.asarray(rs.randn(2))}
  grads = [jax.tree.map(lambda p: jnp.asarray(rs.randn(*p.shape), p.dtype) * 3, params)
           for _ in range(6)]

  @jax.jit
  def traced(st, g, hyper):
    return apply_grads(st, g, optimizer_of(hyper))

  cfgs = [OptimConfig(lr=0.1, warmup_steps=2, total_steps=6, weight_decay=0.05),
          OptimConfig(lr=0.03, warmup_steps=0, total_steps=9, weight_decay=0.0, clip_norm=0.5)]
  for cfg in cfgs:
    opt = make_optimizer(cfg)
    const = jax.jit(lambda st, g, opt=opt: apply_grads(st, g, opt))
    a = b = TrainState.create(params, opt)
    for g in grads:
      a, b = traced(a, g, cfg.array()), const(b, g)
      for k in params:
        np.testing.assert_allclose(a.params[k], b.params[k], rtol=2e-6, atol=1e-7)
    assert int(a.step) == len(grads)
  assert traced._cache_size() == 1


def _fit(out, *, interrupt_at=None, steps=10):
  opt = optax.sgd(0.1)
  run = TrainRun(out, "fp", steps=steps, eval_every=5, checkpoint_every=100, what="test")
  state = run.restore(TrainState.create({"w": jnp.ones((3,))}, opt))
  seen = []

  def step_fn(state, step):
    seen.append(step)
    if step == interrupt_at:
      interrupt._state["requested"] = True  # what the deferred SIGINT handler does
    grads = jax.grad(lambda p: jnp.sum(p["w"] ** 2))(state.params)
    return apply_grads(state, grads, opt), {"loss": jnp.sum(state.params["w"] ** 2)}

  res = run.fit(state, step_fn, lambda st, step: {}, desc="t", show_progress=False)
  return res, seen


def test_ctrl_c_checkpoints_the_finished_step_and_the_rerun_resumes(tmp_path):
  with pytest.raises(TrainInterrupted, match=r"test interrupted; the last checkpoint is step 4 "
                                             r"in .*checkpoints: rerun the same command"):
    _fit(tmp_path / "r", interrupt_at=3)
  assert not interrupt.requested()  # the handler's state is put back
  res, seen = _fit(tmp_path / "r")
  assert seen == list(range(4, 10)) and res.end == 10
  straight, _ = _fit(tmp_path / "s")
  assert jnp.array_equal(res.state.params["w"], straight.state.params["w"])
