#!/usr/bin/env bash
# Regenerates gen/ (Rust, Python and Node.js stubs) from thrift/foqs.thrift with Debian's thrift-compiler.
#   scripts/gen-thrift.sh          rewrite gen/
#   scripts/gen-thrift.sh --check  fail when gen/ differs from what the IDL generates (CI runs this)
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v thrift >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "gen-thrift: installing Debian's thrift-compiler" >&2
    apt-get install -y -qq thrift-compiler >/dev/null 2>&1 ||
      { apt-get update -qq && apt-get install -y -qq thrift-compiler >/dev/null; }
  else
    echo "gen-thrift: the thrift compiler is missing (apt-get install thrift-compiler)" >&2
    exit 1
  fi
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mkdir -p "$out/rs" "$out/py" "$out/js"
thrift --gen rs -out "$out/rs" thrift/foqs.thrift
thrift --gen py -out "$out/py" thrift/foqs.thrift
thrift --gen js:node -out "$out/js" thrift/foqs.thrift

# The generated per-method Foqs*Args / Foqs*Result structs are private; the server decodes
# and encodes them itself (DESIGN.md §2), so make them, their fields and their codec pub.
# Only the part of the file from the first `struct Foqs` on is touched: earlier
# `fn read_from_in_protocol` lines are trait methods and must stay as they are.
rs="$out/rs/foqs.rs"
awk '
  /^struct Foqs[A-Za-z]*(Args|Result) / { tail = 1 }
  tail && /^struct Foqs/ { sub(/^struct /, "pub struct "); inside = 1; print; next }
  tail && inside && /^}/ { inside = 0 }
  tail && inside && /^  [a-z_0-9]+: / { sub(/^  /, "  pub ") }
  tail && /^  fn (read_from_in_protocol|write_to_out_protocol|ok_or)\(/ { sub(/^  fn /, "  pub fn ") }
  { print }
' "$rs" > "$rs.pub"
mv "$rs.pub" "$rs"
if grep -nE '^struct Foqs|^  fn (read_from_in_protocol|write_to_out_protocol)\(' "$rs" |
   awk -F: -v start="$(grep -n '^pub struct Foqs[A-Za-z]*Args ' "$rs" | head -1 | cut -d: -f1)" '$1 >= start' | grep . >/dev/null; then
  echo "gen-thrift: some generated Args/Result items are still private" >&2
  exit 1
fi

if [ "${1:-}" = "--check" ]; then
  if ! diff -r -q "$out" gen >/dev/null 2>&1; then
    echo "gen-thrift: gen/ is stale: run scripts/gen-thrift.sh and commit the result" >&2
    diff -r "$out" gen | head -20 >&2 || true
    exit 1
  fi
  echo "gen-thrift: gen/ is up to date"
else
  rm -rf gen/rs gen/py gen/js
  mkdir -p gen
  cp -r "$out/rs" "$out/py" "$out/js" gen/
  echo "gen-thrift: wrote gen/rs, gen/py and gen/js"
fi
