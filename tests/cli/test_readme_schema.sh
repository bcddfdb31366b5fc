#!/usr/bin/env bash
# The config reference in configs/README.md is the schema's own output (scripts/update_readme_schema.sh rewrites it).
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
sed -n '/<!-- schema:begin -->/,/<!-- schema:end -->/p' "$SRC/configs/README.md" | sed '1d;$d' >"$SCRATCH/readme.md"
[ -s "$SCRATCH/readme.md" ] || fail "configs/README.md has no config reference between the schema markers"
"$FLOWRUN" check --schema | sed 's/^#/##/' >"$SCRATCH/schema.md"
diff "$SCRATCH/schema.md" "$SCRATCH/readme.md" >&2 ||
  fail "configs/README.md's config reference is stale: run scripts/update_readme_schema.sh"
echo "configs/README.md config reference is current"
