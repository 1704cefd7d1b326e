#!/usr/bin/env bash
# Table 3 on real language (the `real` preset), its registered slices in order (docs/tables.md), each a sweep into
# the same OUT: base and E1 first, then D1 and D3, then A1, B1 and C1; A3, the fourth, is over the budget the pilot
# rule left (reports/reference/pilots/real-pilot-rule.md). The same command resumes a stopped table where it stopped
# (finished pairs are skipped, a stopped run resumes from its checkpoint); the report covers every slice that ran.
#
#     scripts/real-table.sh ../shared/data/multi30k runs-real      # about 7.6 hours on 2 cores, projected
set -euo pipefail
data=${1:?usage: scripts/real-table.sh MULTI30K_DIR OUT}
out=${2:?usage: scripts/real-table.sh MULTI30K_DIR OUT}
aiayn=${AIAYN:-aiayn}
for rows in base,E1 base,D1,D3 base,A1,B1,C1; do
    "$aiayn" table3 --preset real --rows "$rows" --data-dir "$data" --out "$out" --report ''
done
"$aiayn" report --runs "$out" --out "$out/reports" --preset real
