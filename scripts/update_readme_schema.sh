#!/usr/bin/env bash
# Regenerates the config reference in configs/README.md (between the schema markers) from
# `flowrun check --schema`, with its headings nested under that file's title. Usage: scripts/update_readme_schema.sh [FLOWRUN]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FLOWRUN="${1:-$ROOT/build/apps/flowrun}"
DOC="$ROOT/configs/README.md"
ref="$("$FLOWRUN" check --schema | sed 's/^#/##/')"
awk -v ref="$ref" '/<!-- schema:begin -->/ { print; print ref; skip = 1; next }
                   /<!-- schema:end -->/ { skip = 0 } !skip' "$DOC" >"$DOC.tmp"
mv "$DOC.tmp" "$DOC"
