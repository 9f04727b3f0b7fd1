// sluice's chat page: plain JavaScript, no build step, nothing fetched from
// other sites. Conversations live in the browser's local storage; replies
// stream from /v1/chat/completions (server-sent events) with the "sluice"
// extension carrying each reply's own figures (decode speed, prefix-cache
// reuse, expert hit rate and bytes read).
"use strict";

const STORE = "sluice.chat";        // conversations and the current one
const SETTINGS = "sluice.settings"; // system prompt and sampling
const KEY = "sluice.apiKey";        // the --api-key, asked for once

const $ = (id) => document.getElementById(id);
let store = loadJSON(STORE, { conversations: [], current: null });
let running = null; // {controller, conv, msg, el} while a reply streams
let pendingRetry = null; // what to run once an API key is given

function loadJSON(key, fallback) {
  try {
    const v = JSON.parse(localStorage.getItem(key));
    return v && typeof v === "object" ? v : fallback;
  } catch (e) {
    return fallback;
  }
}

function save() {
  localStorage.setItem(STORE, JSON.stringify(store));
}

function settings() {
  const num = (id, def) => {
    const v = parseFloat($(id).value);
    return Number.isFinite(v) ? v : def;
  };
  return {
    system: $("system").value,
    temperature: num("temperature", 0.7),
    top_p: num("top-p", 0.95),
    max_tokens: Math.max(1, Math.round(num("max-tokens", 512))),
  };
}

function loadSettings() {
  const s = loadJSON(SETTINGS, {});
  if (typeof s.system === "string") $("system").value = s.system;
  if (s.temperature !== undefined) $("temperature").value = s.temperature;
  if (s.top_p !== undefined) $("top-p").value = s.top_p;
  if (s.max_tokens !== undefined) $("max-tokens").value = s.max_tokens;
  for (const id of ["system", "temperature", "top-p", "max-tokens"]) {
    $(id).addEventListener("input", () => localStorage.setItem(SETTINGS, JSON.stringify(settings())));
  }
}

function current() {
  return store.conversations.find((c) => c.id === store.current) || null;
}

// titleOf is a conversation's name: the start of its first line of text.
function titleOf(text) {
  const line = text.split("\n").map((l) => l.trim()).find((l) => l && !l.startsWith("```")) || "";
  return line.slice(0, 40) || "New chat";
}

function newConversation() {
  const c = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 6), title: "New chat", messages: [] };
  store.conversations.unshift(c);
  store.current = c.id;
  save();
  return c;
}

// ---- rendering ----

// renderText shows text with fenced code blocks as <pre><code> and `code`
// inline, built as DOM nodes (never innerHTML) so that model output cannot
// inject markup.
function renderText(el, text) {
  el.textContent = "";
  const parts = text.split(/^```/m);
  parts.forEach((part, i) => {
    if (i % 2 === 1) {
      const nl = part.indexOf("\n");
      const lang = nl >= 0 ? part.slice(0, nl).trim() : "";
      let code = nl >= 0 ? part.slice(nl + 1) : "";
      code = code.replace(/\n$/, "");
      const pre = document.createElement("pre");
      if (lang) {
        const l = document.createElement("span");
        l.className = "lang";
        l.textContent = lang;
        pre.appendChild(l);
      }
      const c = document.createElement("code");
      c.textContent = code;
      pre.appendChild(c);
      el.appendChild(pre);
      return;
    }
    if (i > 0) part = part.replace(/^[^\n]*\n?/, ""); // the rest of the closing fence's line
    part.split(/(`[^`\n]+`)/).forEach((seg, k) => {
      if (k % 2 === 1) {
        const c = document.createElement("code");
        c.textContent = seg.slice(1, -1);
        el.appendChild(c);
      } else if (seg) {
        el.appendChild(document.createTextNode(seg));
      }
    });
  });
}

function fmt(v, digits) {
  return Number.isFinite(v) ? v.toFixed(digits) : "–";
}

function renderStats(box, m) {
  box.textContent = "";
  const s = m.stats;
  if (!s) return;
  const item = (label, value) => {
    const span = document.createElement("span");
    const b = document.createElement("b");
    b.textContent = value;
    span.append(b, " " + label);
    box.appendChild(span);
  };
  item("tokens", String(s.generated_tokens));
  item("tok/s decode", fmt(s.decode_tok_s, 1));
  item("prompt tokens from the prefix cache", `${s.cached_tokens}/${s.prompt_tokens}`);
  if (s.experts_resident) {
    item("expert hits (all resident)", "100%");
  } else {
    item("expert hit rate", fmt(100 * s.hit_rate, 1) + "%");
    item("MB read/token", fmt(s.mb_per_token, 2));
  }
  if (m.hits && m.hits.length > 1 && !s.experts_resident) {
    const span = document.createElement("span");
    span.className = "chart";
    const cv = document.createElement("canvas");
    cv.title = "expert hit rate of each streamed chunk";
    const lo = drawChart(cv, m.hits);
    span.append(cv, `hit rate per chunk (${Math.round(lo * 100)}–100%)`);
    box.appendChild(span);
  }
}

// drawChart plots the hit rate after each streamed chunk, its axis from a
// tenth below the lowest point (at most 90%) to 100%, and returns that
// lower end.
function drawChart(cv, pts) {
  const lo = Math.max(0, Math.min(0.9, Math.floor(Math.min(...pts) * 10) / 10));
  const w = 160, h = 28, r = window.devicePixelRatio || 1;
  cv.width = w * r;
  cv.height = h * r;
  const g = cv.getContext("2d");
  g.scale(r, r);
  const cs = getComputedStyle(document.documentElement);
  g.strokeStyle = cs.getPropertyValue("--accent");
  g.lineWidth = 1.5;
  g.beginPath();
  pts.forEach((p, i) => {
    const x = pts.length === 1 ? w : (i / (pts.length - 1)) * (w - 2) + 1;
    const y = 2 + ((1 - p) / (1 - lo)) * (h - 4);
    if (i === 0) g.moveTo(x, y);
    else g.lineTo(x, y);
  });
  g.stroke();
  return lo;
}

function messageEl(conv, m, idx) {
  const el = document.createElement("div");
  el.className = "msg " + m.role;
  el.dataset.state = m.state || "done";
  el.dataset.index = idx;
  const who = document.createElement("div");
  who.className = "who";
  const name = document.createElement("span");
  name.textContent = m.role === "assistant" ? "sluice" : m.role;
  who.appendChild(name);
  if (m.state === "stopped") who.append(" · stopped");
  if (m.state === "done" && m.finish === "length") who.append(" · cut at max tokens");
  if (!running) {
    if (m.role === "user") who.appendChild(button("Edit", "edit", () => startEdit(conv, idx, el)));
    if (m.role === "assistant" && idx === conv.messages.length - 1) {
      who.appendChild(button("Regenerate", "regenerate", () => regenerate(conv)));
    }
  }
  const content = document.createElement("div");
  content.className = "content";
  renderText(content, m.content);
  if (m.error) {
    const e = document.createElement("div");
    e.className = "error";
    e.textContent = m.error;
    content.appendChild(e);
  }
  const stats = document.createElement("div");
  stats.className = "stats";
  renderStats(stats, m);
  el.append(who, content, stats);
  return el;
}

function button(label, cls, fn) {
  const b = document.createElement("button");
  b.type = "button";
  b.className = cls;
  b.textContent = label;
  b.addEventListener("click", fn);
  return b;
}

function render() {
  const list = $("conversations");
  list.textContent = "";
  for (const c of store.conversations) {
    const li = document.createElement("li");
    li.className = c.id === store.current ? "current" : "";
    li.dataset.id = c.id;
    const t = document.createElement("span");
    t.textContent = c.title;
    li.appendChild(t);
    li.addEventListener("click", () => {
      if (running) return;
      store.current = c.id;
      save();
      render();
    });
    const del = button("×", "delete", (ev) => {
      ev.stopPropagation();
      if (running && running.conv === c) return;
      store.conversations = store.conversations.filter((x) => x !== c);
      if (store.current === c.id) store.current = store.conversations.length ? store.conversations[0].id : null;
      save();
      render();
    });
    del.title = "Delete this conversation";
    li.appendChild(del);
    list.appendChild(li);
  }
  const box = $("messages");
  box.textContent = "";
  const conv = current();
  if (!conv || conv.messages.length === 0) {
    const p = document.createElement("div");
    p.className = "empty";
    p.textContent = "Ask something. Replies stream from this sluice server; nothing leaves this machine.";
    box.appendChild(p);
  } else {
    conv.messages.forEach((m, i) => box.appendChild(messageEl(conv, m, i)));
  }
  $("send").hidden = !!running;
  $("stop").hidden = !running;
  box.scrollTop = box.scrollHeight;
}

// ---- talking to the server ----

function headers() {
  const h = { "Content-Type": "application/json" };
  const k = localStorage.getItem(KEY);
  if (k) h.Authorization = "Bearer " + k;
  return h;
}

function askKey(retry, message) {
  pendingRetry = retry;
  $("key-form").hidden = false;
  $("composer").hidden = true;
  $("key-error").textContent = message || "";
  $("key-input").focus();
}

async function loadModel() {
  try {
    const r = await fetch("/v1/models", { headers: headers() });
    if (r.status === 401) {
      askKey(loadModel, localStorage.getItem(KEY) ? "The saved key was refused." : "");
      return;
    }
    const j = await r.json();
    const m = j.data && j.data[0];
    if (m) $("model-name").textContent = `${m.id} · ${m.context_length} ctx`;
  } catch (e) {
    $("model-name").textContent = "(server unreachable)";
  }
}

function send(text) {
  let conv = current() || newConversation();
  if (conv.messages.length === 0) conv.title = titleOf(text);
  conv.messages.push({ role: "user", content: text });
  complete(conv);
}

function regenerate(conv) {
  if (conv.messages.length && conv.messages[conv.messages.length - 1].role === "assistant") conv.messages.pop();
  complete(conv);
}

function startEdit(conv, idx, el) {
  const content = el.querySelector(".content");
  const box = document.createElement("div");
  box.className = "edit";
  const ta = document.createElement("textarea");
  ta.value = conv.messages[idx].content;
  const bs = document.createElement("div");
  bs.className = "buttons";
  bs.append(
    button("Save & send", "resend", () => {
      conv.messages = conv.messages.slice(0, idx + 1);
      conv.messages[idx].content = ta.value;
      if (idx === 0) conv.title = titleOf(ta.value);
      complete(conv);
    }),
    button("Cancel", "cancel", render),
  );
  box.append(ta, bs);
  content.replaceWith(box);
  ta.focus();
}

// complete streams an assistant reply to conv's messages.
async function complete(conv) {
  const s = settings();
  const msgs = [];
  if (s.system.trim()) msgs.push({ role: "system", content: s.system });
  for (const m of conv.messages) msgs.push({ role: m.role, content: m.content });
  const m = { role: "assistant", content: "", state: "streaming", hits: [] };
  conv.messages.push(m);
  const controller = new AbortController();
  running = { controller, conv, msg: m };
  save();
  render();
  const el = $("messages").lastElementChild;
  const content = el.querySelector(".content");
  const stats = el.querySelector(".stats");
  const update = () => {
    renderText(content, m.content);
    renderStats(stats, m);
    const box = $("messages");
    if (box.scrollHeight - box.scrollTop - box.clientHeight < 120) box.scrollTop = box.scrollHeight;
  };
  try {
    const r = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers(),
      signal: controller.signal,
      body: JSON.stringify({
        model: "sluice", messages: msgs, stream: true, stream_options: { include_usage: true },
        sluice_stats: true, temperature: s.temperature, top_p: s.top_p, max_tokens: s.max_tokens,
      }),
    });
    if (r.status === 401) {
      conv.messages.pop();
      running = null;
      save();
      render();
      askKey(() => complete(conv), localStorage.getItem(KEY) ? "The saved key was refused." : "");
      return;
    }
    if (!r.ok) {
      let msg = `HTTP ${r.status}`;
      try { msg = (await r.json()).error.message; } catch (e) { /* not JSON */ }
      throw new Error(msg);
    }
    const reader = r.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    let pending = false;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") continue;
          const ch = JSON.parse(data);
          if (ch.error) throw new Error(ch.error.message);
          const c = ch.choices && ch.choices[0];
          if (c && c.delta && c.delta.content) m.content += c.delta.content;
          if (ch.sluice) {
            // The chart shows each chunk's own hit rate, from the change
            // in the reply's running counts.
            const prev = m.stats || { expert_hits: 0, expert_misses: 0 };
            const dh = ch.sluice.expert_hits - prev.expert_hits, dm = ch.sluice.expert_misses - prev.expert_misses;
            if (dh + dm > 0) m.hits.push(dh / (dh + dm));
            m.stats = ch.sluice;
          }
          if (c && c.finish_reason) m.finish = c.finish_reason;
        }
      }
      if (!pending) {
        // One repaint per frame however many chunks arrived.
        pending = true;
        requestAnimationFrame(() => { pending = false; update(); });
      }
    }
    m.state = "done";
  } catch (e) {
    if (controller.signal.aborted) {
      m.state = "stopped";
    } else {
      m.state = "error";
      m.error = String(e.message || e);
    }
  }
  if (m.hits.length > 200) m.hits = m.hits.filter((_, i) => i % Math.ceil(m.hits.length / 200) === 0);
  running = null;
  save();
  render();
}

// ---- wiring ----

$("composer").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = $("prompt").value;
  if (running || !text.trim()) return;
  $("prompt").value = "";
  send(text);
});
$("prompt").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
    ev.preventDefault();
    $("composer").requestSubmit();
  }
});
$("stop").addEventListener("click", () => running && running.controller.abort());
document.addEventListener("keydown", (ev) => {
  if (ev.key === "Escape" && running) running.controller.abort();
});
$("new-chat").addEventListener("click", () => {
  if (running) return;
  const c = current();
  if (!c || c.messages.length) newConversation();
  render();
  $("prompt").focus();
});
$("key-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const k = $("key-input").value.trim();
  if (!k) return;
  localStorage.setItem(KEY, k);
  $("key-input").value = "";
  $("key-form").hidden = true;
  $("composer").hidden = false;
  $("forget-key").hidden = false;
  const retry = pendingRetry;
  pendingRetry = null;
  if (retry) retry();
});
$("forget-key").hidden = !localStorage.getItem(KEY);
$("forget-key").addEventListener("click", () => {
  localStorage.removeItem(KEY);
  $("forget-key").hidden = true;
});

// A reply interrupted by a reload is kept as stopped.
for (const c of store.conversations) {
  for (const m of c.messages) if (m.state === "streaming") m.state = "stopped";
}
loadSettings();
render();
loadModel();
