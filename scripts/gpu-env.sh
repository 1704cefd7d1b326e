# Sourced by scripts/gpu-check.sh and scripts/gpu-wide.sh: what both GPU calls check and set in their environment.
#
# Every value read from the environment is checked before anything is written: a number is digits (passed on as
# data, never as code), a flag 0 or 1, flags of words one line, the scratch folder made; each refusal one line and
# exit 2.
whole() {  # digits without a leading zero: $(( )) reads 08 as octal, and fails on it
  [[ $2 =~ ^[1-9][0-9]{0,8}$ ]] \
    || { echo "$1=$2 is not a whole number from 1 to 999999999 (no leading zero); set $1=N" >&2; exit 2; }
}
oneline() {  # a value the call reads as one line of words: a newline would keep its first line and print both
  [[ $2 != *$'\n'* ]] || { echo "$1 holds a newline; set $1 to one line" >&2; exit 2; }
}
flag() { [[ $2 =~ ^[01]$ ]] || { echo "$1=$2 is not 0 or 1; set $1=0 or $1=1" >&2; exit 2; }; }
scratch() {  # scratch NAME: a fresh folder under $TMPDIR (or /tmp), or one line and exit 2
  mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX" 2>/dev/null \
    || { echo "cannot make a scratch folder under ${TMPDIR:-/tmp}; set TMPDIR to a writable folder" >&2; exit 2; }
}
named_source() {  # a copy without .git: every run records the commit prep wrote (.gpucheck/source) as its own
  if ! git rev-parse HEAD > /dev/null 2>&1 && [ -z "${AIAYN_SOURCE:-}" ] && [ -f .gpucheck/source ]; then
    AIAYN_SOURCE=$(head -c 64 .gpucheck/source)
    export AIAYN_SOURCE
  fi
}
