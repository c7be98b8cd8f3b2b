#!/usr/bin/env bash
# Run a command as on a machine nobody used before: an empty /tmp of its own (the documents'
# /tmp paths and torch's compile cache absent), TMPDIR=/tmp, and a new home, so that trainrun's
# cache (data.cache_dir's default, ~/.cache/trainrun) and every other per-user cache start empty.
# The checkout and its virtual environments are used as they are; all of it is removed afterwards.
#
#   scripts/fresh_machine.sh make test
#
# The private /tmp is a mount namespace (unshare): as root, or where unprivileged user namespaces
# are allowed. .ci/run runs the suites this way (docs/testing.md, "As a fresh machine").
set -euo pipefail

if [ "${1:-}" = "--inside" ]; then  # in the new mount namespace: lay the fresh /tmp and home, then run
  fresh=$2
  shift 2
  mount --make-rprivate /
  checkout=$(pwd -P)
  case "$checkout/" in  # a checkout under /tmp stays where it is, inside the fresh /tmp
    /tmp/*)
      inside=$fresh/tmp/${checkout#/tmp/}
      mkdir -p "$inside"
      mount --bind "$checkout" "$inside"
      ;;
  esac
  mount --rbind "$fresh/tmp" /tmp
  chmod 1777 /tmp
  export PYENV_ROOT=${PYENV_ROOT:-$HOME/.pyenv}  # pyenv's shims, where python3 is one, still find it
  export HOME=$fresh/home TMPDIR=/tmp
  unset XDG_CACHE_HOME XDG_CONFIG_HOME XDG_DATA_HOME TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR
  cd "$checkout"
  exec "$@"
fi

if [ $# -eq 0 ]; then
  echo "usage: scripts/fresh_machine.sh COMMAND [ARGUMENTS...]" >&2
  exit 2
fi
if [ "$(id -u)" -eq 0 ]; then namespace=(unshare --mount); else namespace=(unshare --map-root-user --mount); fi
if ! "${namespace[@]}" true 2>/dev/null; then
  echo "scripts/fresh_machine.sh: cannot make a private /tmp here ('${namespace[*]}' is not allowed)" >&2
  exit 2
fi
fresh=$(mktemp -d "${FRESH_MACHINE_ROOT:-/var/tmp}/trainrun-fresh.XXXXXX")
trap 'rm -rf "$fresh"' EXIT
mkdir "$fresh/tmp" "$fresh/home"
status=0
"${namespace[@]}" bash "$0" --inside "$fresh" "$@" || status=$?
exit "$status"
