// The Markdown a model writes, as DOM nodes built one by one (createElement, textContent): paragraphs,
// headings, lists, quotes, tables, rules, emphasis, inline code, fenced code blocks with a copy button, and
// links whose scheme is http, https or mailto. The text never becomes HTML: a `<script>` or an
// `<img onerror>` in an answer is shown as the characters it is.

// Each pattern runs in time linear in the line (a hostile answer's long runs of spaces must not freeze the page):
// what a single pattern would find by backtracking (a fence's language, a heading's closing #s) is cut out by hand.
const FENCE_OPEN = /^ {0,3}(`{3,}|~{3,})/;
const HEADING_OPEN = /^ {0,3}(#{1,6})\s+/;
const RULE = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/;
const QUOTE = /^ {0,3}>\s?/;
const ITEM = /^( {0,12})([-*+]|\d{1,9}[.)])(\s+|$)(.*)$/;
const TABLE_RULE = /^\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?$/; // on the line trimmed
const SAFE_SCHEMES = new Set(["http:", "https:", "mailto:"]);
const MAX_DEPTH = 8; // quotes and lists inside each other, deeper than any answer needs

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

/** The answer's text as a fragment of DOM nodes. */
export function render(text) {
  const fragment = document.createDocumentFragment();
  blocks(text.replace(/\r\n?/g, "\n").split("\n"), fragment, 0);
  return fragment;
}

/** A line that opens a code block: [its fence, its language ("" when none)], or null. */
function fenceOf(line) {
  const m = FENCE_OPEN.exec(line);
  if (!m) return null;
  const rest = line.slice(m[0].length);
  if (rest.includes("`")) return null;
  return [m[1], /^\s*(\S*)/.exec(rest)[1]];
}

/** A heading's line: [its level, its text without the closing #s], or null. */
function headingOf(line) {
  const m = HEADING_OPEN.exec(line);
  if (!m) return null;
  let text = line.slice(m[0].length).trimEnd();
  let j = text.length;
  while (j > 0 && text[j - 1] === "#") j -= 1;
  if (j < text.length && j > 0 && /\s/.test(text[j - 1])) text = text.slice(0, j).trimEnd();
  return [m[1].length, text];
}

function tableRule(line) {
  return TABLE_RULE.test(line.trim());
}

function closesFence(line, fence) {
  const t = line.trim();
  return t.startsWith(fence) && !t.slice(fence.length).trim() && t[0] === fence[0];
}

/** Draws an answer that is still streaming into `box`, and returns the nodes it added (to look through for
 * citations). What a blank line outside a code fence ends is drawn once and kept: only the text after the last
 * such line is drawn again as more comes, so a long answer costs a frame no more than its last block does. A
 * loose list the blank lines split shows as lists one after another until `whole` (the answer has ended): then
 * the whole text is drawn once, as render() draws it. */
export function streamer(box) {
  let head = ""; // the text drawn for good
  let scanned = 0; // where the lines not yet looked at begin
  let fence = null; // the fence of the code block open at `scanned`
  let tail = []; // the nodes of the text after `head`
  let ended = null; // the whole text, once drawn whole
  const reset = () => {
    head = "";
    scanned = 0;
    fence = null;
    tail = [];
    ended = null;
    box.replaceChildren();
  };
  return (text, whole) => {
    if (whole && text === ended) return [];
    // ended, not more of the same text (a round begun anew), or what the box shows is not this text's
    if (whole || !text.startsWith(head) || (!head && !tail.length)) reset();
    if (whole) {
      const nodes = [...render(text).childNodes];
      appendAll(box, nodes);
      ended = text;
      return nodes;
    }
    let settled = head.length;
    for (let nl = text.indexOf("\n", scanned); nl >= 0; nl = text.indexOf("\n", scanned)) {
      const line = text.slice(scanned, nl);
      if (fence !== null) {
        if (closesFence(line, fence)) fence = null;
      } else {
        const m = fenceOf(line);
        if (m) fence = m[0];
        else if (!line.trim()) settled = nl + 1;
      }
      scanned = nl + 1;
    }
    const added = [];
    for (const node of tail) node.remove();
    if (settled > head.length) {
      const nodes = [...render(text.slice(head.length, settled)).childNodes];
      appendAll(box, nodes);
      for (const node of nodes) added.push(node);
      head = text.slice(0, settled);
    }
    tail = [...render(text.slice(settled)).childNodes];
    appendAll(box, tail);
    for (const node of tail) added.push(node);
    return added;
  };
}

function startsBlock(line) {
  return fenceOf(line) !== null || headingOf(line) !== null || RULE.test(line) || QUOTE.test(line) || ITEM.test(line);
}

function blocks(lines, parent, depth) {
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (!line.trim()) {
      i += 1;
      continue;
    }
    let m = fenceOf(line);
    if (m) {
      const fence = m[0];
      const body = [];
      i += 1;
      while (i < lines.length && !closesFence(lines[i], fence)) {
        body.push(lines[i]);
        i += 1;
      }
      i += 1; // the closing fence (an answer still streaming may not have written it yet)
      parent.append(codeBlock(m[1], body.join("\n")));
      continue;
    }
    if ((m = headingOf(line))) {
      const h = el(`h${m[0]}`);
      inline(m[1], h);
      parent.append(h);
      i += 1;
      continue;
    }
    if (RULE.test(line)) {
      parent.append(el("hr"));
      i += 1;
      continue;
    }
    if (QUOTE.test(line) && depth < MAX_DEPTH) {
      const inner = [];
      while (i < lines.length && lines[i].trim() && QUOTE.test(lines[i])) {
        inner.push(lines[i].replace(QUOTE, ""));
        i += 1;
      }
      const quote = el("blockquote");
      blocks(inner, quote, depth + 1);
      parent.append(quote);
      continue;
    }
    if (ITEM.test(line) && depth < MAX_DEPTH) {
      i = list(lines, i, parent, depth);
      continue;
    }
    if (line.includes("|") && i + 1 < lines.length && tableRule(lines[i + 1]) && lines[i + 1].includes("-")) {
      i = table(lines, i, parent);
      continue;
    }
    const para = [];
    while (i < lines.length && lines[i].trim() && (para.length === 0 || !startsBlock(lines[i]))) {
      para.push(lines[i].trim());
      i += 1;
    }
    const p = el("p");
    inline(para.join("\n"), p);
    parent.append(p);
  }
}

function list(lines, start, parent, depth) {
  const first = ITEM.exec(lines[start]);
  const indent = first[1].length;
  const ordered = /\d/.test(first[2]);
  const node = el(ordered ? "ol" : "ul");
  if (ordered && parseInt(first[2], 10) !== 1) node.start = parseInt(first[2], 10);
  let i = start;
  let loose = false;
  while (i < lines.length) {
    const m = ITEM.exec(lines[i]);
    if (!m || m[1].length !== indent || /\d/.test(m[2]) !== ordered) break;
    const offset = m[1].length + m[2].length + Math.max(1, Math.min(m[3].length, 4));
    const body = [m[4]];
    i += 1;
    while (i < lines.length) {
      const line = lines[i];
      if (!line.trim()) {
        const next = lines[i + 1];
        if (next !== undefined && next.trim() && leading(next) > indent) {
          body.push("");
          loose = true;
          i += 1;
          continue;
        }
        break;
      }
      const item = ITEM.exec(line);
      if (item && item[1].length <= indent) break;
      if (!item && leading(line) <= indent && startsBlock(line)) break;
      body.push(line.slice(Math.min(leading(line), offset)));
      i += 1;
    }
    const li = el("li");
    blocks(body, li, depth + 1);
    node.append(li);
    if (i < lines.length && !lines[i].trim()) {
      const next = ITEM.exec(lines[i + 1] || "");
      if (next && next[1].length === indent && /\d/.test(next[2]) === ordered) {
        loose = true;
        i += 1;
      }
    }
  }
  if (!loose) {
    // a tight list: its items' lone paragraphs are their text, as Markdown renders them (over a copy of the
    // items: a live list of them would be counted again after each change, a pass per item)
    for (const li of [...node.children]) {
      const p = li.firstElementChild;
      if (p && p.tagName === "P") p.replaceWith(...p.childNodes);
    }
  }
  parent.append(node);
  return i;
}

function leading(line) {
  return line.length - line.trimStart().length;
}

function cells(line) {
  let s = line.trim();
  if (s.startsWith("|")) s = s.slice(1);
  if (s.endsWith("|") && !s.endsWith("\\|")) s = s.slice(0, -1);
  return s.split(/(?<!\\)\|/).map((c) => c.trim().replace(/\\\|/g, "|"));
}

function table(lines, start, parent) {
  const head = cells(lines[start]);
  const align = cells(lines[start + 1]).map((c) => (c.endsWith(":") ? (c.startsWith(":") ? "center" : "right") : ""));
  const wrap = el("div", "table");
  const t = el("table");
  const tr = el("tr");
  head.forEach((c, k) => {
    const th = el("th");
    if (align[k]) th.className = `align-${align[k]}`;
    inline(c, th);
    tr.append(th);
  });
  const thead = el("thead");
  thead.append(tr);
  t.append(thead);
  const tbody = el("tbody");
  let i = start + 2;
  while (i < lines.length && lines[i].trim() && lines[i].includes("|")) {
    const row = el("tr");
    cells(lines[i]).slice(0, head.length).forEach((c, k) => {
      const td = el("td");
      if (align[k]) td.className = `align-${align[k]}`;
      inline(c, td);
      row.append(td);
    });
    tbody.append(row);
    i += 1;
  }
  t.append(tbody);
  wrap.append(t);
  parent.append(wrap);
  return i;
}

function codeBlock(lang, code) {
  const box = el("div", "code");
  const head = el("div", "code-head");
  head.append(el("span", "code-lang", lang || "text"));
  const copy = el("button", "copy", "Copy");
  copy.type = "button";
  copy.setAttribute("aria-label", `Copy the ${lang || "text"} code`);
  head.append(copy);
  const pre = el("pre");
  const c = el("code", null, code);
  if (lang) c.dataset.lang = lang;
  pre.append(c);
  box.append(head, pre);
  return box;
}

/** A link's target when its scheme is safe (http, https, mailto), else null: the link stays text. */
export function safeUrl(url) {
  try {
    const u = new URL(url);
    return SAFE_SCHEMES.has(u.protocol) ? u.href : null;
  } catch {
    return null;
  }
}

// Inline spans, tried in this order at each position; `m[1]` (or `m[2]` for links) is the span's content. A code
// span (backticks) is found apart, by TickRuns.
const SPANS = [
  ["escape", /\\([\\`*_{}[\]()#+\-.!~|<>])/y],
  ["strong", /\*\*(?=\S)([\s\S]*?\S)\*\*/y],
  ["strong_", /__(?=\S)([\s\S]*?\S)__(?!\w)/y],
  ["del", /~~(?=\S)([\s\S]*?\S)~~/y],
  ["em", /\*(?=[^\s*])([\s\S]*?[^\s*])\*(?!\*)/y],
  ["em_", /_(?=[^\s_])([\s\S]*?[^\s_])_(?!\w)/y],
  ["link", /\[((?:[^[\]\n]|\[[^[\]\n]*\])*)\]\(\s*<?([^\s<>()]*(?:\([^\s<>()]*\)[^\s<>()]*)*)>?(?:\s+"[^"\n]*")?\s*\)/y],
  ["url", /https?:\/\/[^\s<>()[\]"'`]*[^\s<>()[\]"'`.,;:!?*_~]/y],
];
const SPECIAL = /[\\`*_~[h\n]/g;
// The opening of each span that needs a closing delimiter further on: where the opening is there and the span
// still does not match, no closing delimiter follows, nor will one at any later position of the text, so that
// kind is not tried again there (a line of a hundred thousand unclosed `*` or backticks renders in one pass).
const OPENS = { strong: /\*\*(?=\S)/y, strong_: /__(?=\S)/y, del: /~~(?=\S)/y, em: /\*(?=[^\s*])/y, em_: /_(?=[^\s_])/y };

function inline(text, parent, depth = 0) {
  const closed = new Set(); // the span kinds (a code span: its number of backticks) nothing closes past here
  const ticks = new TickRuns(text);
  let plain = "";
  let i = 0;
  const flush = () => {
    if (plain) parent.append(document.createTextNode(plain));
    plain = "";
  };
  while (i < text.length) {
    SPECIAL.lastIndex = i;
    const found = SPECIAL.exec(text);
    if (!found) {
      plain += text.slice(i);
      break;
    }
    plain += text.slice(i, found.index);
    i = found.index;
    if (text[i] === "\n") {
      flush();
      parent.append(el("br"));
      i += 1;
      continue;
    }
    if (text[i] === "`") {
      // a code span: the whole run of backticks opens it, and the next run of as many closes it; a run that
      // nothing closes is text
      let k = 1;
      while (text[i + k] === "`") k += 1;
      const end = closed.has(k) ? -1 : ticks.end(i, k);
      if (end < 0) {
        closed.add(k);
        plain += text.slice(i, i + k);
        i += k;
        continue;
      }
      const code = text.slice(i + k, end - k);
      flush();
      parent.append(el("code", null, code.length > 2 && code[0] === " " && code.endsWith(" ") ? code.slice(1, -1) : code));
      i = end;
      continue;
    }
    const before = i > 0 ? text[i - 1] : " ";
    let matched = false;
    for (const [kind, re] of SPANS) {
      if ((kind.endsWith("_") || kind === "url") && /\w/.test(before)) continue; // intra-word _ and URLs
      if (closed.has(kind)) continue;
      re.lastIndex = i;
      const m = re.exec(text);
      if (!m) {
        const opens = OPENS[kind];
        if (opens) {
          opens.lastIndex = i;
          if (opens.test(text)) closed.add(kind); // opened, never closed: nor at any later position
        }
        continue;
      }
      const end = re.lastIndex; // before span(), whose inner spans use the same (sticky) expressions
      const node = span(kind, m, depth);
      if (node === null) continue;
      flush();
      parent.append(node);
      i = end;
      matched = true;
      break;
    }
    if (!matched) {
      plain += text[i];
      i += 1;
    }
  }
  flush();
}

/** The runs of backticks of a text, found once, by length: `end(i, k)` is the end (past its closing backticks) of
 * the code span the `k` backticks at `i` open, the next run of exactly `k`; -1 when there is none. Asked at
 * positions that only grow (inline's), each length's runs are walked once: runs of many lengths, each shorter
 * than the last, cost one pass, not one search of the rest of the text for each. */
class TickRuns {
  constructor(text) {
    this.text = text;
    this.runs = null; // length → the starts of the runs of exactly that many backticks, in order
    this.next = new Map(); // length → the index of the first run not yet passed
  }

  end(i, k) {
    if (this.runs === null) {
      this.runs = new Map();
      const re = /`+/g;
      for (let m = re.exec(this.text); m !== null; m = re.exec(this.text)) {
        const starts = this.runs.get(m[0].length);
        if (starts) starts.push(m.index);
        else this.runs.set(m[0].length, [m.index]);
      }
    }
    const starts = this.runs.get(k) || [];
    let p = this.next.get(k) || 0;
    while (p < starts.length && starts[p] < i + k) p += 1; // (the opening run, and those before it)
    this.next.set(k, p);
    return p < starts.length ? starts[p] + k : -1;
  }
}

function span(kind, m, depth) {
  if (kind === "escape") return document.createTextNode(m[1]);
  if (kind === "url") {
    const href = safeUrl(m[0]);
    return href === null ? null : link(href, m[0], false, depth);
  }
  if (kind === "link") {
    const href = safeUrl(m[2]);
    return href === null ? null : link(href, m[1], true, depth);
  }
  if (depth >= MAX_DEPTH) return null;
  const tag = { strong: "strong", strong_: "strong", del: "del", em: "em", em_: "em" }[kind];
  const node = el(tag);
  inline(m[1], node, depth + 1);
  return node;
}

function link(href, label, markdown, depth) {
  const a = el("a");
  a.href = href;
  a.target = "_blank";
  a.rel = "noopener noreferrer nofollow";
  if (markdown && depth < MAX_DEPTH) inline(label, a, depth + 1);
  else a.textContent = label;
  return a;
}

/** `nodes` appended to `box` one call each: spread into one call, 200,000 blocks pass a call's argument limit. */
function appendAll(box, nodes) {
  for (const node of nodes) box.append(node);
}
