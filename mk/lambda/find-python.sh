#!/bin/sh
# Print the path of a working CPython X.Y interpreter (X.Y = $1), or nothing.
# Looks at: python X.Y on PATH, pyenv's installed versions (whose shims only run
# the selected version), then uv-managed interpreters.
want="$1"
works() {
  [ -n "$1" ] && [ "$("$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$want" ]
}
for candidate in \
  "$(command -v "python$want" 2>/dev/null)" \
  $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}/versions/$want".*/bin/"python$want" 2>/dev/null | sort -V -r) \
  "$(command -v uv >/dev/null 2>&1 && uv python find --no-project "$want" 2>/dev/null)"
do
  if works "$candidate"; then
    echo "$candidate"
    exit 0
  fi
done
exit 0
