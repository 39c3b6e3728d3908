// The trace page: recent orders of a tenant and an order's cross-service waterfall. One
// self-contained document (inline CSS and JS; no CDN, no fonts), talking only to this origin.
// The API key is pasted once and kept in the browser's localStorage; `#key=...&order=...` in
// the URL does the same (handy for links and headless checks).
#include "orchestrator/http/pages.hpp"

namespace idemsaga::orchestrator::http {

const std::string& TracePageHtml() {
  static const std::string page = R"html(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>idemsaga traces</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
:root{--bg:#0f1419;--panel:#161c23;--line:#2a323c;--text:#d8dee6;--dim:#8a96a3;--ok:#3fb950;
--err:#f85149;--comp:#d29922;--orch:#58a6ff;--inv:#a371f7;--pay:#3fb9a5}
*{box-sizing:border-box}body{margin:0;font:13px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;
background:var(--bg);color:var(--text)}header{display:flex;gap:12px;align-items:center;padding:10px 16px;
border-bottom:1px solid var(--line);background:var(--panel)}h1{font-size:15px;margin:0 12px 0 0}
input{background:var(--bg);color:var(--text);border:1px solid var(--line);border-radius:4px;padding:5px 8px;width:260px}
button{background:#238636;color:#fff;border:0;border-radius:4px;padding:6px 12px;cursor:pointer}
main{display:grid;grid-template-columns:300px 1fr;height:calc(100vh - 49px)}
#orders{border-right:1px solid var(--line);overflow:auto}#orders div.order{padding:8px 12px;border-bottom:1px solid var(--line);cursor:pointer}
#orders div.order:hover,#orders div.order.sel{background:#1f2630}.badge{display:inline-block;padding:0 6px;border-radius:8px;font-size:11px;margin-left:6px}
.completed{background:#0d3320;color:var(--ok)}.failed{background:#3d1417;color:var(--err)}.started,.compensating{background:#3a2c08;color:var(--comp)}
#detail{overflow:auto;padding:12px 16px}#summary{margin-bottom:10px;color:var(--dim)}#summary b{color:var(--text)}
.span-row{display:grid;grid-template-columns:110px minmax(260px,38%) 1fr 70px;gap:8px;align-items:center;padding:3px 0;border-bottom:1px solid #1b222a}
.svc{font-size:11px;padding:1px 6px;border-radius:3px;text-align:center}.svc-orchestrator{background:#10263f;color:var(--orch)}
.svc-inventory{background:#241a3d;color:var(--inv)}.svc-payment{background:#0f2e2a;color:var(--pay)}
.name{white-space:nowrap;overflow:hidden;text-overflow:ellipsis}.marks{color:var(--dim);font-size:11px;margin-left:6px}
.track{position:relative;height:14px;background:#11171d;border-radius:2px}.bar{position:absolute;top:2px;height:10px;border-radius:2px;background:var(--ok);min-width:2px}
.span-row.error .bar{background:var(--err)}.span-row.error .name{color:var(--err)}
.span-row.compensation .bar{background:var(--comp)}.span-row.compensation .name{color:var(--comp)}
.dur{text-align:right;color:var(--dim)}.legend span{margin-right:14px}.legend i{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:4px;vertical-align:-1px}
#msg{color:var(--err);margin-left:auto}
nav a{color:var(--orch);margin-right:10px;text-decoration:none}nav a.here{color:var(--text);font-weight:bold}
</style></head><body>
<header><h1>idemsaga</h1><nav><a class="here" href="/ui/">Traces</a><a href="/ui/sagas">Sagas</a></nav>
<input id="apikey" type="password" placeholder="tenant API key (kept in this browser)">
<button id="save">Use key</button><button id="reload">Refresh</button><span id="msg"></span></header>
<main><section id="orders"></section><section id="detail"><div id="summary">Pick an order on the left.</div>
<div class="legend"><span><i style="background:var(--ok)"></i>ok</span><span><i style="background:var(--err)"></i>failed</span>
<span><i style="background:var(--comp)"></i>compensation</span></div><div id="waterfall"></div></section></main>
<script>
)html" + std::string(kPageScriptPrelude) +
                                  R"html(async function api(path) {
  const r = await fetch(path, { headers: { Authorization: "Bearer " + apiKey } });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(body.detail || ("HTTP " + r.status));
  return body;
}
function fail(e) { $("msg").textContent = e.message; }
async function loadOrders(select) {
  $("msg").textContent = "";
  if (!apiKey) { $("msg").textContent = "Paste a tenant API key first."; return; }
  try {
    const { sagas } = await api("/v1/sagas?limit=50");
    const list = $("orders"); list.replaceChildren();
    for (const s of sagas) {
      const row = el("div", "order"); row.dataset.key = s.idempotency_key;
      row.append(el("span", "", s.idempotency_key), el("span", "badge " + s.status, s.status + (s.stuck ? " · stuck" : "")));
      row.onclick = () => showTrace(s.idempotency_key);
      list.append(row);
    }
    if (select) showTrace(select);
  } catch (e) { fail(e); }
}
function marks(a) {
  const m = [];
  if (a.derived_key) m.push(a.derived_key);
  if (a.attempt) m.push("attempt " + a.attempt);
  if (a["http.status_code"]) m.push("HTTP " + a["http.status_code"]);
  if (a.replayed === true) m.push("replayed");
  if (a["guard.outcome"]) m.push(a["guard.outcome"]);
  if (a["idempotency.outcome"]) m.push(a["idempotency.outcome"]);
  if (a.stuck === true) m.push("STUCK");
  return m.join(" · ");
}
async function showTrace(key) {
  document.querySelectorAll("#orders .order").forEach((o) => o.classList.toggle("sel", o.dataset.key === key));
  try {
    const t = await api("/v1/orders/" + encodeURIComponent(key) + "/trace");
    const spans = t.spans;
    const byId = new Map(spans.map((s) => [s.span_id, s]));
    const children = new Map();
    const roots = [];
    for (const s of spans) {
      if (s.parent_span_id && byId.has(s.parent_span_id)) {
        if (!children.has(s.parent_span_id)) children.set(s.parent_span_id, []);
        children.get(s.parent_span_id).push(s);
      } else roots.push(s);
    }
    const t0 = Math.min(...spans.map((s) => s.start_time_unix_nano));
    const t1 = Math.max(...spans.map((s) => s.end_time_unix_nano));
    const total = Math.max(1, t1 - t0);
    const w = $("waterfall"); w.replaceChildren();
    const walk = (s, depth) => {
      const comp = s.attributes.compensation === true;
      const row = el("div", "span-row" + (s.status === "error" ? " error" : "") + (comp ? " compensation" : ""));
      row.dataset.spanId = s.span_id;
      const name = el("div", "name", (comp ? "\u21a9 " : "") + s.name);
      name.style.paddingLeft = (depth * 14) + "px";
      name.title = JSON.stringify(s.attributes, null, 1);
      name.append(el("span", "marks", marks(s.attributes)));
      const track = el("div", "track"); const bar = el("div", "bar");
      bar.style.left = ((s.start_time_unix_nano - t0) / total * 100) + "%";
      bar.style.width = ((s.end_time_unix_nano - s.start_time_unix_nano) / total * 100) + "%";
      track.append(bar);
      row.append(el("div", "svc svc-" + s.service, s.service), name, track,
                 el("div", "dur", ((s.end_time_unix_nano - s.start_time_unix_nano) / 1e6).toFixed(1) + " ms"));
      w.append(row);
      (children.get(s.span_id) || []).sort((a, b) => a.start_time_unix_nano - b.start_time_unix_nano)
        .forEach((c) => walk(c, depth + 1));
    };
    roots.sort((a, b) => a.start_time_unix_nano - b.start_time_unix_nano).forEach((r) => walk(r, 0));
    const s = $("summary"); s.replaceChildren();
    s.append("order ", el("b", "", key), " · ", el("span", "badge " + t.order_status, t.order_status),
             " · trace " + t.trace_id + " · " + spans.length + " spans · " + (total / 1e6).toFixed(1) + " ms" +
             (t.complete ? "" : " · waiting for " + t.pending_span_ids.length + " participant span(s)"));
    document.body.dataset.loaded = key;
  } catch (e) { fail(e); }
}
$("save").onclick = () => { apiKey = $("apikey").value.trim(); localStorage.setItem("idemsaga.apiKey", apiKey); loadOrders(); };
$("reload").onclick = () => loadOrders(document.body.dataset.loaded);
loadOrders(params.get("order"));
</script></body></html>
)html";
  return page;
}

}  // namespace idemsaga::orchestrator::http
