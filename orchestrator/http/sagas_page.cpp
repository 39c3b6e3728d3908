// The sagas page: a tenant's recent sagas for an operator, stuck ones first with their last
// error and attempts, filtered by saga and status, each with a link to its trace and buttons
// to retry (a stuck one) or cancel (a running one). Self-contained like the trace page (inline
// CSS and JS, only this origin); it reads and acts through the public API
// (GET /v1/sagas, GET /v1/runs, POST /v1/sagas/{key}/retry|cancel), so it can do nothing the
// tenant's API key could not. `#key=...&saga=...&status=...&stuck=true` preset the filters.
#include "orchestrator/http/pages.hpp"

namespace idemsaga::orchestrator::http {

const std::string& SagasPageHtml() {
  static const std::string page =
      R"html(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>idemsaga sagas</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
:root{--bg:#0f1419;--panel:#161c23;--line:#2a323c;--text:#d8dee6;--dim:#8a96a3;--ok:#3fb950;
--err:#f85149;--comp:#d29922;--link:#58a6ff}
*{box-sizing:border-box}body{margin:0;font:13px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;
background:var(--bg);color:var(--text)}header{display:flex;flex-wrap:wrap;gap:10px;align-items:center;padding:10px 16px;
border-bottom:1px solid var(--line);background:var(--panel)}h1{font-size:15px;margin:0 8px 0 0}
nav a{color:var(--link);margin-right:10px;text-decoration:none}nav a.here{color:var(--text);font-weight:bold}
input,select{background:var(--bg);color:var(--text);border:1px solid var(--line);border-radius:4px;padding:5px 8px}
#apikey{width:200px}#operator{width:120px}
button{background:#238636;color:#fff;border:0;border-radius:4px;padding:5px 10px;cursor:pointer}
button.cancel{background:#8b2c2c}button.retry{background:#9a6a00}
table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:6px 10px;border-bottom:1px solid var(--line);vertical-align:top}
th{color:var(--dim);font-weight:normal}tr.stuck{background:#2a1f08}a{color:var(--link)}
.badge{display:inline-block;padding:0 6px;border-radius:8px;font-size:11px}
.completed{background:#0d3320;color:var(--ok)}.failed{background:#3d1417;color:var(--err)}
.started,.compensating{background:#3a2c08;color:var(--comp)}.stuckmark{background:#5a1d1d;color:#ffb4ae}
.steps span{margin-right:8px;white-space:nowrap}.s-succeeded{color:var(--ok)}.s-failed,.s-in_doubt{color:var(--err)}
.s-compensating{color:var(--comp)}.s-compensated{color:var(--dim)}.s-not_run{color:#55606b}
.error{color:var(--err);max-width:420px}.dim{color:var(--dim)}#msg{margin-left:auto}#msg.bad{color:var(--err)}#msg.good{color:var(--ok)}
</style></head><body>
<header><h1>idemsaga</h1><nav><a href="/ui/">Traces</a><a class="here" href="/ui/sagas">Sagas</a></nav>
<input id="apikey" type="password" placeholder="tenant API key"><button id="save">Use key</button>
<select id="saga"><option value="">every saga</option></select>
<select id="status"><option value="">every status</option><option>started</option><option>compensating</option>
<option>completed</option><option>failed</option></select>
<label><input id="stuck" type="checkbox"> stuck only</label>
<input id="operator" placeholder="operator (you)"><button id="reload">Refresh</button><span id="msg"></span></header>
<main><table><thead><tr><th>key</th><th>saga</th><th>status</th><th>steps</th><th>last error</th><th>updated</th><th></th></tr></thead>
<tbody id="rows"></tbody></table><p id="empty" class="dim" hidden>No saga matches.</p></main>
<script>
)html" +
      std::string(kPageScriptPrelude) +
      R"html($("operator").value = localStorage.getItem("idemsaga.operator") || "";
$("status").value = params.get("status") || "";
$("stuck").checked = params.get("stuck") === "true";
function say(text, good) { $("msg").textContent = text; $("msg").className = good ? "good" : "bad"; }
async function api(path, body) {
  const init = { headers: { Authorization: "Bearer " + apiKey } };
  if (body !== undefined) { init.method = "POST"; init.headers["Content-Type"] = "application/json"; init.body = JSON.stringify(body); }
  const r = await fetch(path, init);
  const json = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(json.detail || json.title || ("HTTP " + r.status));
  return json;
}
async function loadSagaNames() {
  const { sagas } = await api("/v1/runs");
  const select = $("saga"), want = params.get("saga") || select.value;
  select.replaceChildren(el("option", "", "every saga"));
  select.firstChild.value = "";
  for (const s of sagas) select.append(el("option", "", s.name));
  select.value = want;
}
function query(extra) {
  const q = new URLSearchParams({ limit: "100" });
  if ($("saga").value) q.set("saga", $("saga").value);
  if ($("status").value) q.set("status", $("status").value);
  if (extra || $("stuck").checked) q.set("stuck", "true");
  return "/v1/sagas?" + q;
}
async function act(verb, s, button) {
  button.disabled = true;  // one request per click
  const who = $("operator").value.trim();
  localStorage.setItem("idemsaga.operator", who);
  try {
    if (verb === "retry") await api("/v1/sagas/" + encodeURIComponent(s.idempotency_key) + "/retry", {});
    else {
      const reason = window.prompt("Why cancel " + s.idempotency_key + "?", "cancelled from the sagas page");
      if (!reason) { button.disabled = false; return; }
      const body = { reason }; if (who) body.operator = who;
      await api("/v1/sagas/" + encodeURIComponent(s.idempotency_key) + "/cancel", body);
    }
    say(verb + " requested for " + s.idempotency_key, true);
  } catch (e) { say(verb + " " + s.idempotency_key + ": " + e.message); }
  await load();
}
function row(s) {
  const running = s.status === "started" || s.status === "compensating";
  const tr = el("tr", s.stuck ? "stuck" : ""); tr.dataset.key = s.idempotency_key;
  const key = el("td"); const link = el("a", "", s.idempotency_key);
  link.href = "/ui/#order=" + encodeURIComponent(s.idempotency_key); link.title = "trace " + s.trace_id;
  key.append(link);
  const status = el("td"); status.append(el("span", "badge " + s.status, s.status));
  if (s.stuck) status.append(" ", el("span", "badge stuckmark", "stuck"));
  const steps = el("td", "steps");
  for (const st of s.steps) {
    const n = st.name || "?";
    const tries = st.compensation_attempts ? st.attempts + "+" + st.compensation_attempts : String(st.attempts || 0);
    const span = el("span", "s-" + st.status, n + " " + (st.status || "unreadable") + " ×" + tries);
    span.title = (st.derived_key || "") + (st.detail ? "\n" + st.detail : ""); steps.append(span);
  }
  const err = el("td", "error");
  if (s.last_error) {
    err.append(el("b", "", s.last_error.step + (s.last_error.compensation ? " (undo)" : "") + ": "), s.last_error.detail,
               el("span", "dim", " · " + s.last_error.attempts + " attempt" + (s.last_error.attempts === 1 ? "" : "s")));
  }
  const actions = el("td");
  if (running && s.stuck) { const b = el("button", "retry", "Retry"); b.onclick = () => act("retry", s, b); actions.append(b, " "); }
  if (s.status === "started" && !s.cancel_requested) { const b = el("button", "cancel", "Cancel"); b.onclick = () => act("cancel", s, b); actions.append(b); }
  if (s.cancel_requested) actions.append(el("span", "dim", "cancel requested by " + s.cancel_requested.operator));
  tr.append(key, el("td", "", s.saga + " v" + s.saga_version), status, steps, err,
            el("td", "dim", (s.updated_at || "").replace("T", " ").slice(0, 19)), actions);
  return tr;
}
let loads = 0;
async function load() {
  const mine = ++loads;  // a slower, older load must not draw over a newer one
  if (!apiKey) { say("Paste a tenant API key first."); return; }
  try {
    if ($("saga").options.length === 1) await loadSagaNames();
    // Stuck ones first, even when older than the newest hundred.
    const [stuck, recent] = await Promise.all([api(query(true)), $("stuck").checked ? { sagas: [] } : api(query(false))]);
    if (mine !== loads) return;
    const seen = new Set(), list = [];
    for (const s of stuck.sagas.concat(recent.sagas)) {
      if (!seen.has(s.idempotency_key)) { seen.add(s.idempotency_key); list.push(s); }
    }
    $("rows").replaceChildren(...list.map(row));
    $("empty").hidden = list.length > 0;
    document.body.dataset.loaded = String(list.length);
  } catch (e) {
    if (mine !== loads) return;
    $("rows").replaceChildren();  // never leave rows of another key or filter on screen
    say(e.message);
  }
}
$("save").onclick = () => { apiKey = $("apikey").value.trim(); localStorage.setItem("idemsaga.apiKey", apiKey); say(""); load(); };
for (const id of ["saga", "status", "stuck"]) $(id).onchange = load;
$("reload").onclick = load;
load();
</script></body></html>
)html";
  return page;
}

}  // namespace idemsaga::orchestrator::http
