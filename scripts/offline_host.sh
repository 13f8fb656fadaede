#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A GPU host without network access: pack what it needs into one folder on a machine with network, copy the folder
# over, unpack it there. The recipes in benchmarks/ take that folder as OFFLINE_DIR. Its layout:
#   wheels/SET/*.whl   wheels for the host's python, one folder per set; each set installs into its own site dir
#                      (so a set that pins an older numpy, say, never reaches the others)
#   models/            files the recipes read (a GGUF, a prompt file), whole or split as NAME.part00, NAME.part01, ...
#   models/SHA256SUMS  the sha256 of every file added, split or not; `install` checks each after joining
#   site/SET/          made on the host by `install`: the set's installed wheels
#
# On the machine with network:
#   scripts/offline_host.sh wheels DIR SET REQUIREMENT... | -r FILE   pip download SET's wheels for the host
#       (no dependencies are resolved: list every package; PYTHON_VERSION (3.12) and PLATFORMS (manylinux
#       x86-64 tags up to glibc 2.35) describe the host); PART_MB=N splits a wheel larger than N MB into parts
#       (recorded, with its sha256, in wheels/SET/SHA256SUMS; `install` joins them), as `add` does for models
#   scripts/offline_host.sh add DIR FILE [PART_MB]                   FILE -> models/, split into PART_MB parts if
#       given (for copies that limit the size of a file), its sha256 recorded
#   scripts/offline_host.sh wheel DIR SET FILE.whl                    a wheel built here (not on PyPI) -> wheels/SET/,
#       its sha256 recorded (scripts/triton_kernels_wheel.sh uses it)
# On the GPU host:
#   scripts/offline_host.sh install DIR        join split files (models/ and each wheels/SET/), check every sha256,
#       install each wheel set once
#   eval "$(scripts/offline_host.sh env DIR SET...)"   the sets' site dirs first on PYTHONPATH, and
#       TRTLLM_DFLASH_SMOLLM2_GGUF at models/'s SmolLM2 GGUF if it is there
#   scripts/offline_host.sh venv DIR SET VENV  a python environment with SET's site first, then the host's packages:
#       for interpreters started isolated (`python -I` ignores PYTHONPATH), e.g. Triton's python-backend stub.
#       HIDE="scipy sklearn" makes those host modules look absent inside it (built against another numpy, they
#       break their importers; transformers does without them)
set -euo pipefail
die() { echo "error: $*" >&2; exit 2; }
CMD=${1:-}
DIR=${2:-}
[ -n "$CMD" ] && [ -n "$DIR" ] || die "usage: $0 wheels|add|wheel|install|env|venv DIR ... (see the header of $0)"
PY=${PYTHON:-python3}
shift 2

store() {   # FILE DEST [PART_MB]: FILE into DEST, whole or in PART_MB parts, its sha256 in DEST/SHA256SUMS
  local file=$1 dest=$2 part_mb=${3:-} name sum
  name=$(basename "$file")
  mkdir -p "$dest"
  rm -f "$dest/$name.part"[0-9][0-9]
  if [ -n "$part_mb" ]; then   # a whole copy left from before would win over the new parts at install
    [ "$file" = "$dest/$name" ] || rm -f "$dest/$name"
    split -b "${part_mb}M" -d -a 2 "$file" "$dest/$name.part"
  elif [ "$file" != "$dest/$name" ]; then cp "$file" "$dest/$name"; fi
  sum=$(sha256sum "$file" | cut -d' ' -f1)
  touch "$dest/SHA256SUMS"
  { grep -v "  $name\$" "$dest/SHA256SUMS" || true; echo "$sum  $name"; } > "$dest/SHA256SUMS.new"
  mv "$dest/SHA256SUMS.new" "$dest/SHA256SUMS"
}

join_checked() {   # FOLDER: every file SHA256SUMS names, joined from its .partNN pieces if need be, then checked
  local folder=$1 sum name whole parts
  [ -f "$folder/SHA256SUMS" ] || return 0
  while read -r sum name; do
    whole=$folder/$name
    parts=("$whole".part[0-9][0-9])
    if [ ! -f "$whole" ] && [ -e "${parts[0]}" ]; then cat "${parts[@]}" > "$whole.joining" && mv "$whole.joining" "$whole"; fi
    [ -f "$whole" ] || die "install: ${folder#"$DIR"/}/$name is missing (neither the file nor its .partNN pieces are in $folder)"
  done < "$folder/SHA256SUMS"
  (cd "$folder" && sha256sum --quiet -c SHA256SUMS) \
    || die "install: a file in $folder does not match its sha256 in SHA256SUMS: copy it (or its parts) again"
  echo "${folder#"$DIR"/}: $(wc -l < "$folder/SHA256SUMS") file(s) checked"
}
case $CMD in
  wheels)
    SET=${1:?usage: $0 wheels DIR SET REQUIREMENT... | -r FILE}
    shift
    [ $# -gt 0 ] || die "wheels: name the packages of set $SET (pip requirements or -r FILE)"
    PLAT=()
    for p in ${PLATFORMS:-manylinux_2_35_x86_64 manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
                           manylinux1_x86_64}; do PLAT+=(--platform "$p"); done
    mkdir -p "$DIR/wheels/$SET"
    "$PY" -m pip download -q --no-deps --only-binary=:all: --implementation cp \
      --python-version "${PYTHON_VERSION:-3.12}" "${PLAT[@]}" -d "$DIR/wheels/$SET" "$@"
    if [ -n "${PART_MB:-}" ]; then   # a copy that limits the size of a file: large wheels go in parts
      for whl in "$DIR/wheels/$SET"/*.whl; do
        if [ "$(stat -c %s "$whl")" -gt $((PART_MB * 1024 * 1024)) ]; then store "$whl" "$DIR/wheels/$SET" "$PART_MB" && rm "$whl"; fi
      done
    fi
    ls "$DIR/wheels/$SET"
    ;;
  add)
    FILE=${1:?usage: $0 add DIR FILE [PART_MB]}
    PART_MB=${2:-}
    [ -f "$FILE" ] || die "add: $FILE is not a file"
    store "$FILE" "$DIR/models" "$PART_MB"
    ls -l "$DIR/models/$(basename "$FILE")"*
    ;;
  wheel)
    SET=${1:?usage: $0 wheel DIR SET FILE.whl}
    FILE=${2:?usage: $0 wheel DIR SET FILE.whl}
    case $FILE in *.whl) ;; *) die "wheel: $FILE is not a .whl file" ;; esac
    [ -f "$FILE" ] || die "wheel: $FILE is not a file"
    store "$FILE" "$DIR/wheels/$SET"
    ls -l "$DIR/wheels/$SET/$(basename "$FILE")"
    ;;
  install)
    [ -d "$DIR" ] || die "install: $DIR does not exist (copy the folder made on the machine with network)"
    join_checked "$DIR/models"
    for set_dir in "$DIR"/wheels/*/; do [ -d "$set_dir" ] && join_checked "${set_dir%/}"; done
    for set_dir in "$DIR"/wheels/*/; do
      [ -d "$set_dir" ] || continue
      set=$(basename "$set_dir")
      site=$DIR/site/$set
      new=()
      for whl in "$set_dir"*.whl; do
        [ -e "$whl" ] && [ ! -f "$site/.installed-$(basename "$whl")" ] && new+=("$whl")
      done
      [ ${#new[@]} -gt 0 ] || continue
      mkdir -p "$site"
      "$PY" -m pip install -q --no-index --no-deps --target "$site" "${new[@]}"
      for whl in "${new[@]}"; do touch "$site/.installed-$(basename "$whl")"; done
      echo "wheels/$set: ${#new[@]} installed into site/$set"
    done
    ;;
  env)
    [ $# -gt 0 ] || die "env: name the wheel sets to put first on PYTHONPATH"
    paths=""
    for set in "$@"; do
      [ -d "$DIR/site/$set" ] || die "env: $DIR/site/$set does not exist (run: $0 install $DIR)"
      paths+="$(cd "$DIR/site/$set" && pwd):"
    done
    echo "export PYTHONPATH=${paths}\${PYTHONPATH:-}"
    # the packaged SmolLM2 target's GGUF (trtllm_dflash/checkpoints/packaged.py: SMOLLM2_GGUF_NAME, read from
    # TRTLLM_DFLASH_SMOLLM2_GGUF), when it came in models/: without it the recipes would try PyPI
    gguf=$DIR/models/SmolLM2-135M-Instruct.Q4_1.gguf
    if [ -f "$gguf" ]; then echo "export TRTLLM_DFLASH_SMOLLM2_GGUF=$(cd "$DIR/models" && pwd)/$(basename "$gguf")"; fi
    ;;
  venv)
    SET=${1:?usage: $0 venv DIR SET VENV}
    VENV=${2:?usage: $0 venv DIR SET VENV}
    [ -d "$DIR/site/$SET" ] || die "venv: $DIR/site/$SET does not exist (run: $0 install $DIR)"
    site=$(cd "$DIR/site/$SET" && pwd)
    read -r BASE PYV HOST_SITE < <("$PY" -c 'import sys, site; print(sys._base_executable, "%d.%d" % sys.version_info[:2], site.getsitepackages()[0])')
    mkdir -p "$VENV/bin" "$VENV/lib/python$PYV/site-packages"
    ln -sf "$BASE" "$VENV/bin/python3"
    ln -sf python3 "$VENV/bin/python"
    printf 'home = %s\ninclude-system-site-packages = false\nversion = %s\n' "$(dirname "$BASE")" "$PYV" > "$VENV/pyvenv.cfg"
    # The set's site first, then the host's site-packages (as a site dir, so its .pth files run), then what was
    # already on PYTHONPATH when the venv was made (this checkout, other sets).
    {
      echo "$site"
      echo "import site; site.addsitedir('$HOST_SITE')"
      tr ':' '\n' <<<"${PYTHONPATH:-}" | grep -v '^$' || true
      [ -z "${HIDE:-}" ] || echo "import sys; sys.modules.update(dict.fromkeys('${HIDE}'.split()))"
    } > "$VENV/lib/python$PYV/site-packages/offline_host.pth"
    echo "$VENV/bin/python3"
    ;;
  *) die "unknown command $CMD (wheels, add, wheel, install, env, venv)" ;;
esac
