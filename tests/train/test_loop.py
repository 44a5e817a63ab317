"""The training driver's Ctrl-C: the step under way finishes, a checkpoint is written, one line
says where, and the rerun resumes exactly there."""

import jax
import jax.numpy as jnp
import optax
import pytest

from vocabjax import interrupt
from vocabjax.train.loop import TrainInterrupted, TrainRun, TrainState, apply_grads


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
