"""The README opens with two commands (the main job, the tests); `.ci/run` runs the second one
exactly as written (in its fresh virtualenv), so CI tests what a reader runs."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _bash_blocks(text: str) -> list[str]:
  return [b.split("```", 1)[0].strip() for b in text.split("```bash\n")[1:]]


def test_ci_runs_the_readme_test_command_exactly():
  main_job, tests = _bash_blocks((ROOT / "README.md").read_text())[:2]
  assert main_job.endswith("python -m vocabjax.eval") and "\n" not in main_job
  assert "python -m pytest" in tests and "\n" not in tests
  ci = (ROOT / ".ci" / "run").read_text().splitlines()
  assert tests in ci, "'.ci/run' does not run the README's test command as written"
  # both start from a fresh virtualenv, as the reader's does
  assert main_job.startswith("python -m venv .venv && . .venv/bin/activate && ")
  assert tests.startswith("python -m venv .venv && . .venv/bin/activate && ")
  assert any(line.startswith("rm -rf .venv") for line in ci)
