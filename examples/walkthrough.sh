#!/usr/bin/env bash
# The main job on real input: one request travels the whole chain, and every stage's stored
# fact is printed. Run it against a server started with the README's first command, from
# the repository root (the server's default workspace is this source tree):
#
#   cargo run -- serve                    # terminal 1
#   examples/walkthrough.sh               # terminal 2
#
# Environment: MIRA_URL (default http://127.0.0.1:8080), MIRA_TOKEN (default: the bootstrap
# admin token in ${MIRA_DATA_DIR:-./data}/admin.token). Needs curl and jq.
set -euo pipefail

URL="${MIRA_URL:-http://127.0.0.1:8080}"
TOKEN="${MIRA_TOKEN:-$(cat "${MIRA_DATA_DIR:-./data}/admin.token")}"
AUTH=(-H "Authorization: Bearer $TOKEN")
JSON=(-H "Content-Type: application/json")
SYMBOL="${WALKTHROUGH_SYMBOL:-fn grant_approval}"

api() { # METHOD PATH [BODY]
  local out status
  out=$(mktemp)
  if [ $# -ge 3 ]; then
    status=$(curl -sS -o "$out" -w '%{http_code}' -X "$1" "${AUTH[@]}" "${JSON[@]}" --data "$3" "$URL$2")
  else
    status=$(curl -sS -o "$out" -w '%{http_code}' -X "$1" "${AUTH[@]}" "$URL$2")
  fi
  if [ "${status:0:1}" != 2 ]; then
    echo "HTTP $status from $1 $2: $(cat "$out")" >&2
    rm -f "$out"
    exit 1
  fi
  cat "$out"
  rm -f "$out"
}

wait_final() { # INVOCATION_ID → the final invocation JSON
  local inv status
  for _ in $(seq 1 200); do
    inv=$(api GET "/v1/invocations/$1")
    status=$(jq -r .status <<<"$inv")
    case "$status" in queued|running|awaiting_approval) sleep 0.1 ;; *) echo "$inv"; return 0 ;; esac
  done
  echo "invocation $1 did not finish" >&2
  exit 1
}

step() { printf '\n== %s\n' "$*"; }

step "Service"
curl -sS "$URL/readyz" | jq -c .

step "Registry and public surface"
api GET /v1/tools | jq -r '"surface " + .surface_version, (.tools[] | "  \(.id)\t\(.kind // "-")\t\(.state)\t\(.reason.code // "")")'

step "Run"
RUN=$(api POST /v1/runs '{"title":"walkthrough"}')
RUN_ID=$(jq -r .id <<<"$RUN")
jq -c '{id, workspace_id}' <<<"$RUN"

EVENTS=$(mktemp)
curl -sS -N "${AUTH[@]}" "$URL/v1/runs/$RUN_ID/events" >"$EVENTS" &
SSE_PID=$!
trap 'kill $SSE_PID 2>/dev/null || true; rm -f "$EVENTS"' EXIT
sleep 0.3

step "Turn and exposure (what the model sees)"
TURN=$(api POST "/v1/runs/$RUN_ID/turns" "$(jq -nc --arg t "Find where an approval is granted: $SYMBOL" '{task:$t}')")
TURN_ID=$(jq -r .turn_id <<<"$TURN")
jq -c '{turn_id, strategy: .exposure.strategy, candidate_count: .exposure.candidate_count, tools: [.exposure.tools[].function_name]}' <<<"$TURN"

step "Frozen invocation: grep for '$SYMBOL'"
INV=$(api POST "/v1/runs/$RUN_ID/invocations" "$(jq -nc --arg turn "$TURN_ID" --arg p "$SYMBOL" \
  '{turn_id:$turn, tool_id:"grep", tool_call_id:"call_grep_1", input:{pattern:$p, literal:true, glob:"*.rs"}}')")
jq -c '{invocation_id, tool_id, tool_call_id, input_hash, status, input}' <<<"$INV"
GREP=$(wait_final "$(jq -r .invocation_id <<<"$INV")")
jq -c '{status, matches: [.result.output.matches[] | {path, line, text}], evidence_ids}' <<<"$GREP"
HIT_PATH=$(jq -r '.result.output.matches[0].path' <<<"$GREP")
HIT_LINE=$(jq -r '.result.output.matches[0].line' <<<"$GREP")
if [ "$HIT_PATH" = null ]; then echo "no match for $SYMBOL" >&2; exit 1; fi

step "Frozen invocation: read_open $HIT_PATH around line $HIT_LINE"
START=$(( HIT_LINE > 2 ? HIT_LINE - 2 : 1 ))
INV=$(api POST "/v1/runs/$RUN_ID/invocations" "$(jq -nc --arg turn "$TURN_ID" --arg p "$HIT_PATH" --argjson s "$START" \
  '{turn_id:$turn, tool_id:"read_open", tool_call_id:"call_open_1", input:{path:$p, start_line:$s, end_line:($s+12)}}')")
OPEN=$(wait_final "$(jq -r .invocation_id <<<"$INV")")
jq -r '"status \(.status); lines \(.result.output.start_line)-\(.result.output.end_line) of \(.result.output.total_lines); sha256 \(.result.output.sha256)", .result.output.content' <<<"$OPEN"

step "Evidence and Planner acceptance"
EVIDENCE_ID=$(jq -r '.evidence_ids[0]' <<<"$OPEN")
api POST "/v1/evidence/$EVIDENCE_ID/acceptance" '{"accepted":true,"note":"this is where grants are applied"}' \
  | jq -c '{id, kind, content_sha256, provenance, acceptance}'

sleep 0.5
step "Events received on the SSE stream"
grep -E '^(id|event):' "$EVENTS" | paste - - | sed 's/^/  /'
COUNT=$(grep -c '^id:' "$EVENTS" || true)

step "Each stage's fact"
TOOL=$(api GET "/v1/tools/read_open?turn=$TURN_ID")
STORED_TURN=$(api GET "/v1/turns/$TURN_ID")
printf '  registry:      read_open is registered (kind %s)\n' "$(jq -r .kind <<<"$TOOL")"
printf '  surface:       %s\n' "$(jq -r '[.stages[] | "\(.stage)=\(.status)"] | join(" ")' <<<"$TOOL")"
printf '  exposure:      turn %s stored with strategy %s, %s tools\n' "$TURN_ID" "$(jq -r .exposure.strategy <<<"$STORED_TURN")" "$(jq '.exposure.tools | length' <<<"$STORED_TURN")"
printf '  invocation:    %s frozen as %s\n' "$(jq -r .invocation_id <<<"$OPEN")" "$(jq -r .input_hash <<<"$OPEN")"
printf '  approval:      not required (read tool inside the workspace): approval_id=%s\n' "$(jq -r '.approval_id // "none"' <<<"$OPEN")"
printf '  harness:       %s, started %s, finished %s\n' "$(jq -r .status <<<"$OPEN")" "$(jq -r .started_at <<<"$OPEN")" "$(jq -r .finished_at <<<"$OPEN")"
printf '  result:        ok=%s\n' "$(jq -r .result.ok <<<"$OPEN")"
printf '  evidence:      %s (file sha256 %s)\n' "$EVIDENCE_ID" "$(jq -r .result.output.sha256 <<<"$OPEN")"
printf '  acceptance:    %s\n' "$(api GET "/v1/evidence/$EVIDENCE_ID" | jq -c .acceptance)"
printf '  events:        %s on the stream\n' "$COUNT"
[ "$COUNT" -ge 10 ] || { echo "expected at least 10 events on the stream" >&2; exit 1; }
echo
echo "walkthrough complete"
