// trainrun Explorer: draws the data trainrun/report/explorer.py embeds (columnar: one array a
// field; strings kept once in D.strings and referred to by index) with the embedded plotly.js.
// Series' seed means and Pareto frontiers come computed from Python; reading a target off a
// frontier here is curves.reach's interpolation and the texts are trainrun report's formats
// (tests/test_explore.py holds the two equal in a browser).
"use strict";

const D = JSON.parse(document.getElementById("explorer-data").textContent);
const S = D.strings;
const SERIES = D.series;
const RUNS = D.runs;
const POINTS = D.points;
const FILTERS = { model: "model", data: "data", hardware: "hardware", label: "recipe", origin: "source" };
const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
  "#bcbd22", "#17becf"];
const $ = (id) => document.getElementById(id);

const seriesCount = SERIES.label.length;
const runsOf = Array.from({ length: seriesCount }, () => []);
RUNS.series.forEach((s, r) => runsOf[s].push(r));
const pointsOf = Array.from({ length: seriesCount }, () => []);
POINTS.series.forEach((s, p) => pointsOf[s].push(p));
const labels = [...new Set(SERIES.label)].sort();
const methodNames = [...new Set(SERIES.methods.flat())].sort();
const runsPerTask = new Map();
RUNS.series.forEach((s) => runsPerTask.set(SERIES.task[s], (runsPerTask.get(SERIES.task[s]) || 0) + 1));
const tasks = [...runsPerTask.keys()].sort((a, b) => runsPerTask.get(b) - runsPerTask.get(a));  // most runs first
const hoverCache = new Map();

const state = {
  axis: "time",
  task: tasks[0],
  target: null,
  baseline: D.baseline,
  excluded: Object.fromEntries(Object.keys(FILTERS).map((key) => [key, new Set()])),
  methods: Object.fromEntries(methodNames.map((name) => [name, "any"])),
  renders: 0,
};

function field(key, s) {
  return key === "origin" ? (SERIES.published[s] ? "published" : "your runs") : SERIES[key][s];
}

function ruleOf(task) {
  const s = SERIES.task.indexOf(task);
  return D.rules[SERIES.rule[s]];
}

function visibleSeries() {
  const shown = [];
  for (let s = 0; s < seriesCount; s++) {
    if (SERIES.task[s] !== state.task) continue;
    if (Object.keys(FILTERS).some((key) => state.excluded[key].has(field(key, s)))) continue;
    const methods = SERIES.methods[s];
    const wanted = methodNames.every((name) => state.methods[name] === "any"
      || (state.methods[name] === "with") === methods.includes(name));
    if (wanted) shown.push(s);
  }
  return shown;
}

// --- trainrun report's rules and formats -------------------------------------------------------

function reached(rule, value, target) {
  return rule.higher_is_better ? value >= target : value <= target;
}

// what x is on each axis, for runs and for seed means
const RUN_X = { time: RUNS.seconds, cost: RUNS.cost };
const POINT_X = { time: POINTS.seconds, cost: POINTS.cost };

// curves.reach: the axis value at which a frontier (cheapest first) first reaches the target.
function reach(frontier, target, axis, rule) {
  const measure = POINT_X[axis];
  for (let k = 0; k < frontier.length; k++) {
    const point = frontier[k];
    if (reached(rule, POINTS.quality[point], target)) {
      if (k === 0) return { value: measure[point], atMost: true };
      const before = frontier[k - 1];
      const fraction = (target - POINTS.quality[before]) / (POINTS.quality[point] - POINTS.quality[before]);
      return { value: measure[before] + fraction * (measure[point] - measure[before]), atMost: false };
    }
  }
  return null;
}

// curves.speedup
function speedup(theirs, mine) {
  if (theirs === null || mine === null || (theirs.atMost && mine.atMost)) return null;
  return { value: theirs.value / mine.value, bound: mine.atMost ? ">=" : theirs.atMost ? "<=" : "" };
}

// Python's number formats, digit for digit: rounded on the double's exact decimal value with exact
// ties to even (toFixed and toExponential take ties away from zero: 19.25 would show as 19.3, not
// Python's 19.2). toFixed(100) is exact to 100 places, far past where a double can come near a tie.
function exactDigits(value) {
  const [whole, fraction] = Math.abs(value).toFixed(100).split(".");
  return { digits: whole + fraction, point: whole.length };
}

function roundDigits(kept, rest) {
  const last = Number(kept[kept.length - 1] || "0");
  const up = rest[0] > "5" || (rest[0] === "5" && (/[1-9]/.test(rest.slice(1)) || last % 2 === 1));
  return up ? (BigInt(kept || "0") + 1n).toString().padStart(kept.length, "0") : kept;
}

// format(value, f".{places}f")
function fixed(value, places) {
  const { digits, point } = exactDigits(value);
  const kept = roundDigits(digits.slice(0, point + places), digits.slice(point + places));
  const whole = kept.slice(0, kept.length - places).replace(/^0+(?=\d)/, "");
  const text = places ? `${whole}.${kept.slice(kept.length - places)}` : whole;
  return (value < 0 || Object.is(value, -0) ? "-" : "") + text;
}

// format(value, f".{precision}g")
function generalFormat(value, precision) {
  if (value === 0) return Object.is(value, -0) ? "-0" : "0";
  const { digits, point } = exactDigits(value);
  const first = digits.search(/[1-9]/);
  let exponent = point - first - 1;
  let kept = roundDigits(digits.slice(first, first + precision), digits.slice(first + precision));
  if (kept.length > precision) {
    kept = kept.slice(0, precision);
    exponent += 1;
  }
  const sign = value < 0 ? "-" : "";
  if (exponent >= -4 && exponent < precision) {
    const text = fixed(Math.abs(value), precision - 1 - exponent);
    return sign + (text.includes(".") ? text.replace(/\.?0+$/, "") : text);
  }
  const mantissa = `${kept[0]}.${kept.slice(1)}`.replace(/\.?0+$/, "");
  return `${sign}${mantissa}e${exponent < 0 ? "-" : "+"}${String(Math.abs(exponent)).padStart(2, "0")}`;
}

function dollars(value) {
  if (value === null || value === undefined) return "-";
  if (value < 1) return `$${generalFormat(value, 3)}`;
  const [whole, cents] = fixed(value, 2).split(".");
  return `$${whole.replace(/\B(?=(\d{3})+(?!\d))/g, ",")}.${cents}`;
}

function qualityText(rule, value) {
  if (value === null || value === undefined) return "-";
  return rule.percent ? `${fixed(value * 100, 2)}%` : fixed(value, 4);
}

function reachTime(found) {
  return found === null ? "not reached" : `${found.atMost ? "<=" : ""}${fixed(found.value, 1)} s`;
}

function reachMoney(found) {
  return found === null ? "-" : `${found.atMost ? "<=" : ""}${dollars(found.value)}`;
}

function speedupText(found) {
  return found === null ? "-" : `${found.bound}${fixed(found.value, 2)}x`;
}

// --- the page -----------------------------------------------------------------------------------

function escapeHtml(text) {
  return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

function recipeOf(s) {
  return SERIES.label[s] + (SERIES.published[s] ? " (published)" : "");
}

function whereOf(s) {
  return [SERIES.model[s], SERIES.data[s], SERIES.hardware[s]].join(", ");
}

function seriesName(s) {
  return `${recipeOf(s)} · ${whereOf(s)}`;
}

function runHover(r) {
  if (hoverCache.has(r)) return hoverCache.get(r);
  const s = RUNS.series[r];
  const rule = D.rules[SERIES.rule[s]];
  const lines = [
    `<b>${escapeHtml(S[RUNS.folder[r]])}</b>`,
    `recipe ${escapeHtml(SERIES.label[s])} · budget ${escapeHtml(S[RUNS.budget[r]])} · seed ${RUNS.seed[r]}`,
    `methods: ${escapeHtml(SERIES.methods[s].join(", ") || "none")}`,
    `${escapeHtml(rule.label)} ${qualityText(rule, RUNS.quality[r])} (${rule.direction})`,
    `time ${fixed(RUNS.seconds[r], 1)} s · cost ${dollars(RUNS.cost[r])} on ${escapeHtml(SERIES.hardware[s])}`,
    SERIES.published[s] ? `source: ${escapeHtml(S[RUNS.command[r]])}` : `bottleneck: ${escapeHtml(S[RUNS.bottleneck[r]])}`,
    "click for the command",
  ];
  const text = lines.join("<br>");
  hoverCache.set(r, text);
  return text;
}

function tracesOf(s, colour, rule) {
  const axis = state.axis;
  const runX = RUN_X[axis];
  const pointX = POINT_X[axis];
  const symbol = SERIES.published[s] ? "diamond" : "circle";
  const group = String(s);
  const drawn = runsOf[s].filter((r) => runX[r] !== null);
  const means = pointsOf[s].filter((p) => pointX[p] !== null);
  const frontier = D.frontiers[axis][s];
  const pointHover = (p) => `${escapeHtml(SERIES.label[s])} at ${escapeHtml(S[POINTS.budget[p]])}: `
    + `${qualityText(rule, POINTS.quality[p])} ± ${qualityText(rule, POINTS.quality_sd[p])} over `
    + `${POINTS.seeds[p]} seed(s), ${fixed(POINTS.seconds[p], 1)} ± ${fixed(POINTS.seconds_sd[p], 1)} s`;
  return [
    {
      type: "scatter", mode: "markers", name: seriesName(s), legendgroup: group, showlegend: false,
      x: drawn.map((r) => runX[r]), y: drawn.map((r) => RUNS.quality[r]), customdata: drawn,
      hovertext: drawn.map(runHover), hoverinfo: "text", meta: { kind: "runs" },
      marker: { color: colour, size: 6, opacity: 0.45, symbol },
    },
    {
      type: "scatter", mode: "markers", name: seriesName(s), legendgroup: group, showlegend: false,
      x: means.map((p) => pointX[p]), y: means.map((p) => POINTS.quality[p]), customdata: means,
      hovertext: means.map(pointHover), hoverinfo: "text", meta: { kind: "means" },
      marker: { color: colour, size: 11, symbol: `${symbol}-open`, line: { width: 2 } },
      error_y: { type: "data", array: means.map((p) => POINTS.quality_sd[p]), color: colour, thickness: 1 },
      error_x: axis === "time"
        ? { type: "data", array: means.map((p) => POINTS.seconds_sd[p]), color: colour, thickness: 1 }
        : { visible: false },
    },
    {
      type: "scatter", mode: "lines", name: seriesName(s), legendgroup: group, hoverinfo: "skip",
      x: frontier.map((p) => pointX[p]), y: frontier.map((p) => POINTS.quality[p]), meta: { kind: "frontier" },
      line: { color: colour, width: 2, dash: SERIES.published[s] ? "dot" : "solid" },
    },
  ];
}

function baselineFor(s, shown) {
  const candidates = shown.filter((b) => SERIES.label[b] === state.baseline);
  const same = candidates.find((b) => ["model", "data", "hardware", "published"].every((k) => SERIES[k][b] === SERIES[k][s]));
  return same !== undefined ? same : candidates.length ? candidates[0] : null;
}

function renderReadout(shown, rule) {
  const head = $("readout").tHead;
  const body = $("readout").tBodies[0];
  const target = state.target;
  $("readout-title").textContent = target === null
    ? "To the target: enter a target"
    : `To ${rule.label} ${qualityText(rule, target)} (${rule.direction})`;
  head.innerHTML = "<tr><th>recipe</th><th>model, data, hardware</th><th>time</th><th>cost</th>"
    + `<th>speed-up (time)</th><th>speed-up (cost)</th></tr>`;
  const rows = [];
  for (const s of shown) {
    if (target === null) break;
    const time = reach(D.frontiers.time[s], target, "time", rule);
    const money = reach(D.frontiers.cost[s], target, "cost", rule);
    const base = baselineFor(s, shown);
    let gains = ["-", "-"];
    if (base === s) gains = ["baseline", "baseline"];
    else if (base !== null) {
      gains = ["time", "cost"].map((axis) => speedupText(speedup(
        reach(D.frontiers[axis][base], target, axis, rule), reach(D.frontiers[axis][s], target, axis, rule))));
    }
    const cells = [recipeOf(s), whereOf(s), reachTime(time), time === null ? "-" : reachMoney(money), ...gains];
    rows.push(`<tr data-series="${s}">${cells.map((c) => `<td>${escapeHtml(c)}</td>`).join("")}</tr>`);
  }
  body.innerHTML = rows.join("");
}

function render() {
  const started = performance.now();
  const rule = ruleOf(state.task);
  const shown = visibleSeries();
  const traces = shown.flatMap((s) => tracesOf(s, PALETTE[labels.indexOf(SERIES.label[s]) % PALETTE.length], rule));
  const layout = {
    margin: { t: 30, r: 10 },
    hovermode: "closest",
    xaxis: { title: { text: state.axis === "time" ? "training time (s, evaluation excluded)" : "training cost ($)" },
      type: $("logx").checked ? "log" : "linear" },
    yaxis: { title: { text: `${rule.label} (${rule.direction})` }, tickformat: rule.percent ? ".1%" : "" },
    legend: { orientation: "h", y: -0.18 },
    hoverlabel: { align: "left" },
    shapes: state.target === null ? [] : [{ type: "line", xref: "paper", x0: 0, x1: 1, y0: state.target,
      y1: state.target, line: { color: "#888", dash: "dash", width: 1 } }],  // the target quality
  };
  renderReadout(shown, rule);
  return Plotly.react($("chart"), traces, layout, { displaylogo: false, responsive: true }).then(() => {
    return new Promise((painted) => requestAnimationFrame(() => setTimeout(painted, 0)));  // drawn on screen
  }).then(() => {
    state.renders += 1;
    document.body.dataset.renders = state.renders;
    document.body.dataset.renderMs = (performance.now() - started).toFixed(1);
    if (state.renders === 1) document.body.dataset.openMs = performance.now().toFixed(1);
  });
}

function setTarget(text) {
  const rule = ruleOf(state.task);
  const value = parseFloat(text);
  state.target = Number.isFinite(value) ? (rule.percent ? value / 100 : value) : null;
}

function showTargetOf(task) {
  const rule = ruleOf(task);
  const first = (D.targets[task] || [])[0];
  $("target-unit").textContent = rule.percent ? "%" : rule.label;
  $("target").value = first === undefined ? "" : String(rule.percent ? first * 100 : first);
  setTarget($("target").value);
}

function buildControls() {
  for (const task of tasks) $("task").add(new Option(task, task));
  for (const label of labels) $("baseline").add(new Option(label, label, false, label === state.baseline));
  if (state.baseline === null && labels.length) state.baseline = $("baseline").value;
  for (const [key, title] of Object.entries(FILTERS)) {
    const values = [...new Set(Array.from({ length: seriesCount }, (_, s) => field(key, s)))].sort();
    const box = document.createElement("fieldset");
    box.dataset.filter = key;
    box.innerHTML = `<legend>${title}</legend>` + values.map((value) => `<label><input type="checkbox" checked`
      + ` value="${escapeHtml(value)}"> ${escapeHtml(value)}</label>`).join("");
    box.addEventListener("change", (event) => {
      state.excluded[key][event.target.checked ? "delete" : "add"](event.target.value);
      render();
    });
    $("filters").append(box);
  }
  for (const name of methodNames) {
    const label = document.createElement("label");
    label.innerHTML = `<select data-method="${escapeHtml(name)}"><option value="any">any</option>`
      + `<option value="with">with</option><option value="without">without</option></select> ${escapeHtml(name)}`;
    label.firstChild.addEventListener("change", (event) => { state.methods[name] = event.target.value; render(); });
    $("methods").append(label);
  }
  if (!methodNames.length) $("methods").append("no run uses a method");
  $("axis").addEventListener("change", (event) => { state.axis = event.target.value; render(); });
  $("logx").addEventListener("change", render);
  $("task").addEventListener("change", (event) => { state.task = event.target.value; showTargetOf(state.task); render(); });
  $("target").addEventListener("input", (event) => { setTarget(event.target.value); render(); });
  $("baseline").addEventListener("change", (event) => { state.baseline = event.target.value; render(); });
  $("chart").on("plotly_click", (event) => {
    const point = event.points[0];
    if (point.data.meta.kind !== "runs") return;
    const r = point.customdata;
    const s = RUNS.series[r];
    const what = SERIES.published[s] ? "published" : S[RUNS.folder[r]];
    $("selected").textContent = `${what}\n${S[RUNS.command[r]]}`;
  });
}

function start() {
  const published = RUNS.series.filter((s) => SERIES.published[s]).length;
  $("summary").textContent = `${RUNS.series.length - published} runs`
    + (published ? ` and ${published} published points` : "") + ` in ${seriesCount} series`;
  $("notes").textContent = D.notes.join("; ");
  Plotly.newPlot($("chart"), [], {}, { displaylogo: false, responsive: true });
  buildControls();
  showTargetOf(state.task);
  render();
}

start();
