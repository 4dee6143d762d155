// voxmux status page: polls /status.json and speaks through /v1/audio/speech. Plain browser JS,
// no build step and nothing loaded from elsewhere.
"use strict";

const $ = (id) => document.getElementById(id);
let status = null;
let audioURL = null;

function authHeaders() {
  const key = $("key").value.trim();
  return key ? { Authorization: "Bearer " + key } : {};
}

function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

function fmt(n, digits) {
  return typeof n === "number" && isFinite(n) ? n.toFixed(digits) : "–";
}

function stateClass(s) {
  return s === "ready" ? "ok" : s === "failed" || s === "unhealthy" ? "bad" : "warn";
}

function gpuText(g) {
  const parts = [];
  if (g.name) parts.push("#" + g.index + " " + g.name);
  if (g.memory_total_bytes) parts.push(fmt(g.memory_used_bytes / 2 ** 30, 1) + "/" + fmt(g.memory_total_bytes / 2 ** 30, 1) + " GiB");
  if (typeof g.utilization_percent === "number") parts.push(g.utilization_percent + "% busy");
  if (typeof g.temperature_c === "number") parts.push(g.temperature_c + " °C");
  if (g.healthy === false) parts.push("unhealthy" + (g.reason ? ": " + g.reason : ""));
  return parts.join(", ");
}

function renderStatus(s) {
  status = s;
  $("model").textContent = s.model.name + (s.model.aliases.length ? " (also " + s.model.aliases.join(", ") + ")" : "");
  // The credit the voices' licences ask for, shown where audio is made.
  $("attribution").textContent = s.model.attribution || "";
  $("attribution").hidden = !s.model.attribution;
  const r = $("ready");
  r.textContent = s.ready ? "ready" : "not ready";
  r.className = "badge " + (s.ready ? "ok" : "bad");
  $("queue").textContent = "Queue: " + s.queue_length + " waiting of " + s.queue_size + ".";

  const tbody = $("groups").tBodies[0];
  tbody.replaceChildren();
  for (const g of s.groups) {
    const tr = document.createElement("tr");
    cell(tr, g.name);
    cell(tr, g.state + (g.reason ? " (" + g.reason + ")" : ""), stateClass(g.state));
    const gpus = cell(tr, g.gpus.length ? g.gpus.join(", ") : "CPU");
    for (const st of (g.health && g.health.gpus) || []) {
      const d = document.createElement("div");
      d.className = "gpu";
      d.textContent = gpuText(st);
      gpus.appendChild(d);
    }
    cell(tr, g.inflight + " / " + g.capacity, "num");
    cell(tr, String(g.restarts), "num");
    cell(tr, g.instances.map((i) => i.name + " " + i.state + " (" + i.inflight + "/" + i.capacity + ")").join("; "));
    tbody.appendChild(tr);
  }

  const rec = s.recent;
  $("summary").textContent = rec.count
    ? "Last " + rec.count + " with audio: TTFB p50 " + fmt(rec.ttfb_ms_p50, 0) + " ms, p95 " + fmt(rec.ttfb_ms_p95, 0) +
      " ms; RTF p50 " + fmt(rec.rtf_p50, 3) + ", p95 " + fmt(rec.rtf_p95, 3) + (rec.errors ? "; " + rec.errors + " errors" : "") + "."
    : "No requests yet.";
  const rb = $("recent").tBodies[0];
  rb.replaceChildren();
  for (const q of rec.requests.slice(0, 20)) {
    const tr = document.createElement("tr");
    cell(tr, new Date(q.at).toLocaleTimeString());
    cell(tr, q.status + (q.outcome && q.outcome !== "ok" ? " " + q.outcome : ""), q.status === 200 && q.outcome === "ok" ? "ok" : "bad");
    cell(tr, q.format || "–");
    cell(tr, String(q.chars), "num");
    cell(tr, fmt(q.audio_seconds, 2), "num");
    cell(tr, fmt(q.ttfb_ms, 0), "num");
    cell(tr, q.rtf ? fmt(q.rtf, 3) : "–", "num");
    rb.appendChild(tr);
  }
}

async function pollStatus() {
  try {
    const r = await fetch("/status.json", { cache: "no-store" });
    if (r.ok) renderStatus(await r.json());
  } catch (e) {
    $("ready").textContent = "unreachable";
    $("ready").className = "badge bad";
  }
}

async function loadVoices() {
  const sel = $("voice");
  try {
    const r = await fetch("/v1/audio/voices", { headers: authHeaders() });
    if (!r.ok) {
      sel.replaceChildren();
      if (r.status === 401) $("result").textContent = "Enter an API key to list the voices.";
      return;
    }
    const list = await r.json();
    const keep = sel.value;
    sel.replaceChildren();
    for (const v of list.data) {
      const o = document.createElement("option");
      o.value = o.textContent = v.id;
      sel.appendChild(o);
    }
    if (keep) sel.value = keep;
  } catch (e) {
    $("result").textContent = "Cannot list voices: " + e;
  }
}

// pcm is raw 24 kHz s16le mono: give it a WAV header so that the browser can play it.
function wavOf(pcm) {
  const h = new DataView(new ArrayBuffer(44));
  const str = (o, s) => { for (let i = 0; i < s.length; i++) h.setUint8(o + i, s.charCodeAt(i)); };
  str(0, "RIFF"); h.setUint32(4, 36 + pcm.byteLength, true); str(8, "WAVE");
  str(12, "fmt "); h.setUint32(16, 16, true); h.setUint16(20, 1, true); h.setUint16(22, 1, true);
  h.setUint32(24, 24000, true); h.setUint32(28, 48000, true); h.setUint16(32, 2, true); h.setUint16(34, 16, true);
  str(36, "data"); h.setUint32(40, pcm.byteLength, true);
  return new Blob([h.buffer, pcm], { type: "audio/wav" });
}

async function speak(ev) {
  ev.preventDefault();
  const format = $("format").value;
  const body = {
    model: status ? status.model.name : undefined,
    input: $("text").value,
    voice: $("voice").value || undefined,
    response_format: format,
    speed: Number($("speed").value) || 1,
  };
  const btn = $("speak");
  const audio = $("audio");
  btn.disabled = true;
  audio.dataset.state = "loading";
  $("result").textContent = "Speaking…";
  const t0 = performance.now();
  try {
    const r = await fetch("/v1/audio/speech", {
      method: "POST",
      headers: Object.assign({ "Content-Type": "application/json" }, authHeaders()),
      body: JSON.stringify(body),
    });
    if (!r.ok) {
      let msg = r.status + " " + r.statusText;
      try { msg += ": " + (await r.json()).error.message; } catch (e) { /* not JSON */ }
      throw new Error(msg);
    }
    let blob = await r.blob();
    const bytes = blob.size;
    if (format === "pcm") blob = wavOf(await blob.arrayBuffer());
    if (audioURL) URL.revokeObjectURL(audioURL);
    audioURL = URL.createObjectURL(blob);
    audio.src = audioURL;
    audio.dataset.bytes = String(bytes);
    audio.dataset.state = "loaded";
    $("result").textContent = bytes + " bytes of " + format + " in " + Math.round(performance.now() - t0) +
      " ms (request " + r.headers.get("X-Request-Id") + ").";
    audio.play().catch(() => { /* autoplay refused: the controls are there */ });
  } catch (e) {
    audio.dataset.state = "error";
    $("result").textContent = "Failed: " + e.message;
  } finally {
    btn.disabled = false;
    pollStatus();
  }
}

async function init() {
  const r = await fetch("/status.json", { cache: "no-store" });
  const s = await r.json();
  renderStatus(s);
  const fsel = $("format");
  for (const f of s.formats) {
    const o = document.createElement("option");
    o.value = o.textContent = f;
    fsel.appendChild(o);
  }
  fsel.value = s.default_format;
  $("key-label").hidden = !s.auth_required;
  $("key").addEventListener("change", loadVoices);
  $("speak-form").addEventListener("submit", speak);
  await loadVoices();
  document.body.dataset.ready = "true";
  setInterval(pollStatus, 2000);
}

init();
