"""The model zoo: names users type, and where their weights come from.

Embedded pairs live under parity/assets/. Real pairs come from a path given on
the command line, an environment variable, or the local Hugging Face cache;
`local` is whatever --target-path/--draft-path name (e.g. a `parity models
synth` pair). Nothing is ever downloaded.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from parity.errors import ParityInputError

ASSETS = Path(__file__).resolve().parent.parent / "assets"
DEFAULT_MODEL = "tiny-llama3-eagle"
DEFAULT_SCENARIO = "scenarios/default.yaml"
LOCAL_MODEL = "local"


@dataclass(frozen=True)
class ModelEntry:
    name: str
    head: str                 # "eagle1", "eagle3", or "any" (local: read from the checkpoint)
    target_repo: str          # a Hugging Face repo id, or the embedded folder
    draft_repo: str
    embedded: bool
    description: str
    scenario: str = DEFAULT_SCENARIO    # what `parity run --model NAME` runs when no --scenario is given
    synth: tuple[str, str] | None = None    # (shape, head) of `parity models synth` that stands in, no download


ZOO: dict[str, ModelEntry] = {e.name: e for e in [
    ModelEntry("tiny-llama3-eagle", "eagle1", "tiny-llama3-eagle/target", "tiny-llama3-eagle/eagle", True,
               "embedded tiny Llama-3 (2 layers, hidden 128) + EAGLE-1 head, trained by `parity models build`"),
    ModelEntry("tiny-llama3-eagle3", "eagle3", "tiny-llama3-eagle3/target", "tiny-llama3-eagle3/eagle3", True,
               "the same tiny target + EAGLE-3 head (aux layers 0, 1, 2; draft vocabulary 256), "
               "`parity models build --pair tiny-llama3-eagle3`"),
    ModelEntry("llama3-eagle", "eagle1", "meta-llama/Meta-Llama-3-8B-Instruct", "yuhuili/EAGLE-LLaMA3-Instruct-8B",
               False, "Llama-3-8B-Instruct + EAGLE-1 head", "scenarios/llama3-eagle.yaml", ("llama3-8b", "eagle1")),
    ModelEntry("llama3.1-eagle3", "eagle3", "meta-llama/Llama-3.1-8B-Instruct", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
               False, "Llama-3.1-8B-Instruct + EAGLE-3 head", "scenarios/llama3-eagle.yaml", ("llama3-8b", "eagle3")),
    ModelEntry(LOCAL_MODEL, "any", "--target-path DIR", "--draft-path DIR", False,
               "the checkpoints in two local folders (e.g. from `parity models synth`); architecture and head "
               "layout are read from their config.json and weights"),
]}


def get_entry(name: str) -> ModelEntry:
    if name not in ZOO:
        raise ParityInputError(f"unknown model {name!r}; known models: {', '.join(ZOO)}")
    return ZOO[name]


def scenario_of(name: str, scenario: str | None) -> str:
    """The scenario to run: the one given, else the model's own (an 8B pair's is scenarios/llama3-eagle.yaml)."""
    return scenario or get_entry(name).scenario


def _no_download_route(entry: ModelEntry) -> str:
    """The synthetic stand-in of `entry`'s shape and head, and the command that runs it (empty if it has none)."""
    if entry.synth is None:
        return ""
    shape, head = entry.synth
    out = f"/tmp/synth-{shape}-{head}"
    return (f"; or, with no download, a random-weights pair of the same shape: `parity models synth --shape {shape} "
            f"--head {head} --out {out}`, then `parity run --model {LOCAL_MODEL} --target-path {out}/target "
            f"--draft-path {out}/{head} --scenario {entry.scenario}`")


def hf_cache_dirs() -> list[Path]:
    """Hugging Face hub cache folders, in the order transformers looks at them."""
    dirs = []
    if os.environ.get("HF_HUB_CACHE"):
        dirs.append(Path(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        dirs.append(Path(os.environ["HF_HOME"]) / "hub")
    dirs.append(Path.home() / ".cache" / "huggingface" / "hub")
    return dirs


def _from_cache(repo: str) -> tuple[Path | None, list[str]]:
    tried = []
    for cache in hf_cache_dirs():
        snapshots = cache / ("models--" + repo.replace("/", "--")) / "snapshots"
        tried.append(str(snapshots))
        if snapshots.is_dir():
            found = sorted((p for p in snapshots.iterdir() if (p / "config.json").is_file()),
                           key=lambda p: p.stat().st_mtime)
            if found:
                return found[-1], tried
    return None, tried


def _env_name(entry: ModelEntry, role: str) -> str:
    return "PARITY_" + entry.name.upper().replace("-", "_").replace(".", "_") + f"_{role.upper()}_PATH"


def check_model_paths(name: str, target_path: str | None, draft_path: str | None) -> None:
    """Refuse paths an embedded model would ignore, and `local` without both paths (exit 2, one line)."""
    entry = get_entry(name)
    given = [flag for flag, path in (("--target-path", target_path), ("--draft-path", draft_path)) if path]
    if entry.embedded and given:
        them, paths = ("them", "paths") if len(given) > 1 else ("it", "path")
        raise ParityInputError(f"{' and '.join(given)} given with the embedded model {name!r}, which would ignore "
                               f"{them}: add `--model {LOCAL_MODEL}` to run those checkpoints (or drop the {paths})")
    missing = [flag for flag, path in (("--target-path", target_path), ("--draft-path", draft_path)) if not path]
    if name == LOCAL_MODEL and missing:
        raise ParityInputError(f"--model {LOCAL_MODEL} needs both --target-path DIR and --draft-path DIR "
                               f"(missing {' and '.join(missing)})")


def _local_paths(target_path: str, draft_path: str) -> tuple[Path, Path]:
    found = []
    for flag, path in (("--target-path", target_path), ("--draft-path", draft_path)):
        if not (Path(path) / "config.json").is_file():
            raise ParityInputError(f"{LOCAL_MODEL}: {flag} {path} holds no config.json (expected a Hugging Face "
                                   f"checkpoint folder)")
        found.append(Path(path))
    return found[0], found[1]


def resolve_paths(name: str, target_path: str | None = None, draft_path: str | None = None) -> tuple[Path, Path]:
    """Directories of the target and the draft head for `name`, or exit-2 errors saying what to do.

    Embedded pairs: their asset folders (paths are refused, not ignored). `local`:
    the two paths, both required. Real pairs: each comes from, in order, the
    command-line path, the environment variable, the local Hugging Face cache
    (never the network). A path given explicitly (flag or variable) that holds
    no config.json is an error of its own.
    """
    entry = get_entry(name)
    check_model_paths(name, target_path, draft_path)
    if entry.embedded:
        return ASSETS / entry.target_repo, ASSETS / entry.draft_repo
    if name == LOCAL_MODEL:
        return _local_paths(target_path, draft_path)
    found, missing = [], []
    for role, repo, given, flag in (("target", entry.target_repo, target_path, "--target-path"),
                                    ("draft", entry.draft_repo, draft_path, "--draft-path")):
        env = _env_name(entry, role)
        for source, candidate in ((flag, given), (env, os.environ.get(env))):
            if candidate:
                if not (Path(candidate) / "config.json").is_file():
                    raise ParityInputError(f"{name}: {source} {candidate} holds no config.json (expected a "
                                           f"Hugging Face snapshot of {repo})")
                found.append(Path(candidate))
                break
        else:
            cached, tried = _from_cache(repo)
            if cached is None:
                missing.append((repo, flag, env, tried))
            found.append(cached)
    if missing:
        what = "; ".join(f"{repo} (tried {', '.join(tried)})" for repo, _, _, tried in missing)
        how = " and ".join(f"`hf download {repo}`" for repo, _, _, _ in missing)
        flags = ", ".join(f"{flag} DIR or {env}" for _, flag, env, _ in missing)
        raise ParityInputError(f"{name}: weights not found locally for {what}; nothing is downloaded at run time: "
                               f"run {how} on a machine with hub access (the Hugging Face cache is then found "
                               f"offline), or point {flags} at a downloaded snapshot{_no_download_route(entry)}")
    return found[0], found[1]


def availability(name: str) -> str:
    """'embedded', 'local', 'missing', or 'by path' (the `local` model) for `parity models list`."""
    entry = get_entry(name)
    if name == LOCAL_MODEL:
        return "by path"
    if entry.embedded:
        return "embedded" if (ASSETS / entry.target_repo / "config.json").is_file() else "missing"
    try:
        resolve_paths(name)
    except ParityInputError:
        return "missing"
    return "local"
