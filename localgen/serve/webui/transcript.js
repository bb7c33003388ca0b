// Conversations out of the browser and back: a JSON export (every branch, importable here), a Markdown
// transcript (the branch on screen), and the file download both use.

import { imported, path } from "./tree.js";

export const FORMAT = "localgen-chat";

/** The JSON export of some conversations: every message of every branch. */
export function exportJson(conversations) {
  return JSON.stringify({ format: FORMAT, version: 1, conversations }, null, 1);
}

/** The conversations in an export file (or a single conversation), each checked and given a new id. */
export function importJson(text) {
  let doc;
  try {
    doc = JSON.parse(text);
  } catch {
    throw new Error("the file is not JSON");
  }
  const list = doc && doc.format === FORMAT ? doc.conversations : [doc];
  if (!Array.isArray(list) || list.length === 0) throw new Error("the file holds no conversation");
  return list.map((c, k) => {
    try {
      return imported(c);
    } catch (e) {
      throw new Error(`conversation ${k + 1}: ${e.message}`);
    }
  });
}

/** The branch on screen as Markdown: the system prompt, then each message under a heading. */
export function exportMarkdown(conv) {
  const parts = [`# ${conv.name || "Conversation"}`];
  if (conv.system) parts.push(`**System:** ${conv.system}`);
  for (const m of path(conv)) {
    const who = m.role === "user" ? "User" : `Assistant${m.model ? ` (${m.model})` : ""}`;
    parts.push(`## ${who}`);
    for (const r of m.rounds || []) parts.push(...roundMarkdown(r));
    if (m.reasoning) parts.push(m.reasoning.trim().split("\n").map((l) => `> ${l}`).join("\n"));
    if (m.images && m.images.length) parts.push(`*${m.images.length} image${m.images.length > 1 ? "s" : ""} attached*`);
    parts.push(m.content || "");
    parts.push(...endMarkdown(m));
    if (m.sources) parts.push(...sourcesMarkdown(m.sources));
  }
  return `${parts.join("\n\n")}\n`;
}

/** How an answer ended where it is not whole, as its note on the page says it: an error, a stop, a cut (a failed
 * answer was an empty section, a cut one read as whole). */
function endMarkdown(m) {
  if (m.error) return [`*${m.error.kind === "interrupted" ? "" : "Failed: "}${m.error.message}*`];
  if (m.stopped) return ["*Stopped.*"];
  if (m.finish === "length") return ["*Cut short: the answer reached its length limit.*"];
  if (m.finish === "tool_steps") return ["*Still calling tools when the rounds ran out: its last calls were not run.*"];
  return [];
}

/** The excerpts of the documents an answer was sent: each with its number, id, collection and score, then its text
 * quoted. */
function sourcesMarkdown(sources) {
  if (!sources.length) return ["*Sources: no excerpt of the documents was sent.*"];
  return ["**Sources:**", ...sources.map((s, k) => {
    const score = Number.isFinite(s.score) ? ` (score ${s.score.toFixed(3)})` : "";
    // a line Markdown would read as a heading, a quote, a list item or a rule stays the excerpt's text
    const quoted = s.text.split("\n").map((l) => `> ${l.replace(/^(\s*)([#>+*-])/, "$1\\$2")}`).join("\n");
    const store = s.store ? ` in ${s.store}` : "";
    return `${k + 1}. \`${s.id}\`${store}${score}\n\n${quoted.replace(/^/gm, "   ")}`;
  })];
}

/** A tool round of an answer: what the model said, each call with its arguments, and what came back. */
function roundMarkdown(r) {
  const parts = [];
  if (r.reasoning) parts.push(r.reasoning.trim().split("\n").map((l) => `> ${l}`).join("\n"));
  if (r.content) parts.push(r.content);
  for (const call of r.tool_calls) {
    parts.push(`**Tool call:** \`${call.function.name}\`\n\n${fenced(pretty(call.function.arguments), "json")}`);
    const result = (r.results || []).find((x) => x.tool_call_id === call.id);
    if (!result) parts.push("*Not run.*");
    else if (result.declined) parts.push("*Declined: the model was told the user declined.*");
    else parts.push(`**${result.is_error ? "Tool error" : "Result"}:**\n\n${fenced(result.content, "")}`);
  }
  return parts;
}

/** A tool call's arguments as indented JSON (as written, when they are not JSON). */
export function pretty(args) {
  try {
    return JSON.stringify(JSON.parse(args), null, 2);
  } catch {
    return args;
  }
}

function fenced(text, lang) {
  let longest = 2; // a loop, not Math.max(...runs): a text of many runs would pass more arguments than a call takes
  for (const run of text.match(/`+/g) || []) longest = Math.max(longest, run.length);
  const fence = "`".repeat(longest + 1);
  return `${fence}${lang}\n${text}\n${fence}`;
}

/** A file saved by the browser. */
export function download(name, text, type) {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const a = document.createElement("a");
  a.href = url;
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

/** A name for a file: the conversation's, without what file systems refuse. */
export function fileName(conv, extension) {
  const base = (conv.name || "conversation").replace(/[^\p{L}\p{N} _.-]+/gu, "").trim().slice(0, 60) || "conversation";
  return `${base}.${extension}`;
}
