#!/usr/bin/env bash
# Regenerates the key table of docs/configuration.md from the program's one key table
# (`nanogpt train --keys=markdown`), between the page's keys:begin and keys:end lines.
# tests/test_docs.cpp fails until this has been run after a key was added, renamed or changed.
#   scripts/gen_config_doc.sh [NANOGPT_BINARY]      # default: build/nanogpt
set -euo pipefail
cd "$(dirname "$0")/.."
binary=${1:-build/nanogpt}
page=docs/configuration.md
[[ -x $binary ]] || { echo "error: no program at '$binary': build it first (scripts/build.sh)" >&2; exit 1; }
table=$("$binary" train --keys=markdown)
grep -q '^<!-- keys:begin' "$page" && grep -q '^<!-- keys:end' "$page" ||
  { echo "error: $page lacks its <!-- keys:begin --> / <!-- keys:end --> lines" >&2; exit 1; }
tmp=$(mktemp "$page.XXXXXX")
TABLE=$table awk '
  /^<!-- keys:begin/ { print; print ""; print ENVIRON["TABLE"]; print ""; skipping = 1; next }
  /^<!-- keys:end/   { skipping = 0 }
  !skipping          { print }
' "$page" > "$tmp"
mv "$tmp" "$page"
echo "[docs] $page: $(grep -c '^| `' <<<"$table") keys from $binary"
