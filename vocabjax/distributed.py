"""Multi-process runs through `jax.distributed` (one process per host, or several local ones).

Every command that can span processes (`python -m vocabjax.generate`, `python -m
vocabjax.calibrate count`) takes

    --coordinator HOST:PORT --num-processes N --process-id I

or, when they are left out, the environment variables JAX_COORDINATOR_ADDRESS,
JAX_NUM_PROCESSES and JAX_PROCESS_ID. `initialize` checks them (a process id out of range, a
count below 1, a malformed address are errors naming the value) and calls
`jax.distributed.initialize` before any JAX computation; on the CPU backend it selects the gloo
collectives, which cross-process programs on CPU need. After it, `jax.devices()` lists every
process's devices, so `vocabjax.sharding.make_mesh` spans them all; inputs that every process
holds alike (weights read from the same file, the same prompts) are placed on the global mesh,
and results are written by process 0 (`is_main`); what process 0 alone reads (which records
a resumed run already has) reaches the others through `broadcast_from_main`, so no process
needs another's files.
"""

from __future__ import annotations

import argparse
import os

ENV = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


def add_arguments(parser: argparse.ArgumentParser) -> None:
  g = parser.add_argument_group("multi-process (jax.distributed)")
  g.add_argument("--coordinator", help="HOST:PORT of process 0's coordinator (default: "
                 "$JAX_COORDINATOR_ADDRESS; unset: one process)")
  g.add_argument("--num-processes", type=int,
                 help="processes taking part (default: $JAX_NUM_PROCESSES)")
  g.add_argument("--process-id", type=int,
                 help="this process's id in [0, num-processes) (default: $JAX_PROCESS_ID)")


def settings(coordinator=None, num_processes=None, process_id=None, env=None):
  """(coordinator, num_processes, process_id) from the arguments, else the environment, or
  None for a single-process run; ValueError naming a bad value."""
  env = os.environ if env is None else env
  coordinator = coordinator or env.get(ENV[0])
  if num_processes is None and env.get(ENV[1]):
    num_processes = _int(env[ENV[1]], ENV[1])
  if process_id is None and env.get(ENV[2]):
    process_id = _int(env[ENV[2]], ENV[2])
  if coordinator is None and num_processes is None and process_id is None:
    return None
  if coordinator is None or num_processes is None or process_id is None:
    raise ValueError(f"a multi-process run needs the coordinator address, the process count and "
                     f"this process's id; got coordinator={coordinator!r}, "
                     f"num_processes={num_processes}, process_id={process_id}")
  host, sep, port = coordinator.rpartition(":")
  if not sep or not host or not port.isdigit():
    raise ValueError(f"coordinator={coordinator!r}: expected HOST:PORT")
  if num_processes < 1:
    raise ValueError(f"num_processes={num_processes} must be >= 1")
  if not 0 <= process_id < num_processes:
    raise ValueError(f"process_id={process_id} is out of range for num_processes="
                     f"{num_processes} (ids are 0 .. {num_processes - 1})")
  return coordinator, num_processes, process_id


def _int(text: str, name: str) -> int:
  try:
    return int(text)
  except ValueError:
    raise ValueError(f"${name}={text!r} is not an integer") from None


def initialize(coordinator=None, num_processes=None, process_id=None) -> bool:
  """Join the run described by the arguments or the environment (module doc); False (and
  nothing done) for a single-process run."""
  s = settings(coordinator, num_processes, process_id)
  if s is None:
    return False
  import jax

  if s[1] > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  timeout = init_timeout()
  import sys
  print(f"[vocabjax] process {s[2]} of {s[1]}: waiting up to {timeout} s for the coordinator "
        f"at {s[0]} and the other {s[1] - 1} process(es) "
        f"(${TIMEOUT_ENV} sets the limit)", file=sys.stderr, flush=True)
  if s[2] != 0:
    # JAX's client aborts the process (a C++ check failure) when its deadline passes: a
    # coordinator that never comes is found here first, with a clean error
    timeout = wait_for_coordinator(s[0], timeout, s[2], s[1])
  try:
    jax.distributed.initialize(coordinator_address=s[0], num_processes=s[1], process_id=s[2],
                               initialization_timeout=timeout)
  except Exception as e:  # XlaRuntimeError: DEADLINE_EXCEEDED, UNAVAILABLE, ...
    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
    raise ValueError(f"process {s[2]} of {s[1]} could not join the run at {s[0]} within "
                     f"{timeout} s ({first}); start every process with the same --coordinator "
                     f"and --num-processes, process ids 0..{s[1] - 1}") from None
  return True


TIMEOUT_ENV = "VOCABJAX_INIT_TIMEOUT"


def wait_for_coordinator(address: str, timeout: int, pid: int, n: int) -> int:
  """Wait until process 0's coordinator accepts connections at HOST:PORT; the seconds left of
  `timeout`, or ValueError naming the address once it has passed."""
  import socket
  import time

  host, _, port = address.rpartition(":")
  deadline = time.monotonic() + timeout
  while True:
    try:
      with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=1):
        return max(1, int(deadline - time.monotonic()))
    except OSError:
      if time.monotonic() >= deadline:
        raise ValueError(f"process {pid} of {n}: no coordinator answered at {address} within "
                         f"{timeout} s; start process 0 with the same --coordinator (it hosts "
                         f"the coordinator), or raise ${TIMEOUT_ENV}") from None
      time.sleep(0.5)


def init_timeout() -> int:
  """Seconds a process waits for the others to join (${TIMEOUT_ENV}, default 300)."""
  import os

  raw = os.environ.get(TIMEOUT_ENV, "300")
  try:
    value = int(raw)
  except ValueError:
    raise ValueError(f"${TIMEOUT_ENV}={raw!r} is not a whole number of seconds") from None
  if value < 1:
    raise ValueError(f"${TIMEOUT_ENV}={value} must be >= 1 second")
  return value


def initialize_from_args(args: argparse.Namespace) -> bool:
  return initialize(args.coordinator, args.num_processes, args.process_id)


def is_main() -> bool:
  """Whether this process writes results (process 0, or the only one)."""
  import jax

  return jax.process_index() == 0


def broadcast_from_main(x):
  """Process 0's value of the array `x` on every process (as is in a single-process run): for
  decisions that only process 0 can make, such as which records a resumed run still needs."""
  import jax
  import numpy as np

  if jax.process_count() == 1:
    return np.asarray(x)
  from jax.experimental import multihost_utils

  return np.asarray(multihost_utils.broadcast_one_to_all(np.asarray(x)))
