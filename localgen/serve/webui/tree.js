// A conversation is a tree of messages, as llama-server's page keeps one: editing a message or regenerating an
// answer adds a sibling (a branch) instead of replacing it, and `current` is the leaf of the branch on screen.
// Every message hangs under the hidden root; the path from the root to `current` is what the model is sent.

export const ROOT = "root";
export const SETTINGS = ["temperature", "top_p", "top_k", "min_p", "max_tokens", "seed"];
export const TOOL_MODES = ["auto", "required", "off"];

function newId() {
  return crypto.randomUUID ? crypto.randomUUID() : `${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`;
}

/** A conversation with no messages (kept in the browser once it has one). */
export function conversation() {
  const now = Date.now();
  const settings = Object.fromEntries(SETTINGS.map((k) => [k, null]));
  return {
    id: newId(), name: "", created: now, updated: now, model: null, system: "", settings, tools: toolSettings({}),
    documents: documentSettings({}),
    current: ROOT, messages: { [ROOT]: { id: ROOT, parent: null, children: [], role: "root" } },
  };
}

/** How a conversation uses the server's tools: {mode: auto | required | off, ask: whether each call waits for
 * Run}. A conversation kept before tools existed has none: auto, asking. */
export function toolSettings(conv) {
  const t = conv.tools && typeof conv.tools === "object" ? conv.tools : {};
  return { mode: TOOL_MODES.includes(t.mode) ? t.mode : "auto", ask: t.ask !== false };
}

export const MAX_RESULTS = 50; // excerpts a question may be sent at most (file_search's max_num_results)

/** The documents a conversation answers from: {stores: the ids of the server's vector stores searched for
 * each question, results: how many excerpts at most (null: the server's default)}, none by default (and in a
 * conversation kept before the page had documents). */
export function documentSettings(conv) {
  const d = conv.documents && typeof conv.documents === "object" ? conv.documents : {};
  const stores = Array.isArray(d.stores) ? d.stores.filter((s) => typeof s === "string" && s && s.length <= 200) : [];
  const n = d.results;
  const results = Number.isInteger(n) && n >= 1 && n <= MAX_RESULTS ? n : null;
  return { stores: [...new Set(stores)].slice(0, 64), results };
}

/** A new message under `parent`; the branch on screen becomes the one that ends with it. */
export function add(conv, parent, fields) {
  const message = { id: newId(), parent, children: [], created: Date.now(), content: "", ...fields };
  conv.messages[message.id] = message;
  conv.messages[parent].children.push(message.id);
  conv.current = message.id;
  conv.updated = Date.now();
  return message;
}

/** Where a new message goes when the branch on screen ends at `id`: under it, unless the branch holds an
 * answer still being written (by another tab): then beside that answer's question, a new branch, so that no
 * message is filed under an unfinished answer and no request sends the model one. */
export function askUnder(conv, id = conv.current) {
  const open = path(conv, id).find((m) => m.role === "assistant" && m.pending);
  if (!open) return id;
  const question = conv.messages[open.parent];
  return question.role === "user" ? question.parent : question.id;
}

/** The messages from the first to `id` (default: the branch on screen), the root left out. */
export function path(conv, id = conv.current) {
  const out = [];
  for (let m = conv.messages[id]; m && m.id !== ROOT; m = conv.messages[m.parent]) out.push(m);
  return out.reverse();
}

/** The message's siblings (itself among them): the versions the < n/m > arrows step through. */
export function siblings(conv, id) {
  const parent = conv.messages[conv.messages[id].parent];
  return parent ? parent.children : [id];
}

/** Show the branch through `id`: down its latest children to a leaf. */
export function show(conv, id) {
  let m = conv.messages[id];
  while (m.children.length) m = conv.messages[m.children[m.children.length - 1]];
  conv.current = m.id;
}

/** When a message last changed (an answer changes while it streams): what decides between two copies of it. */
function changed(m) {
  return Number.isFinite(m.updated) ? m.updated : m.created || 0;
}

const META = ["name", "system", "settings", "model", "tools", "documents"];

/** Takes into `conv` (in place: its objects stay the ones the page holds) what another copy of it, written by
 * another tab, has and it lacks: every message it has not got, a later version of one it has (the answer
 * another tab was still writing), and its name and settings if they changed later. Messages are only ever
 * added, so nothing either tab wrote is lost. True when `conv` took something. */
export function merge(conv, other) {
  if (damage(other)) return false; // a copy set by hand or cut off: nothing of it is taken
  let took = false;
  for (const [id, m] of Object.entries(other.messages)) {
    const mine = conv.messages[id];
    if (!mine) {
      conv.messages[id] = { ...m, children: [] };
      took = true;
    } else if (id !== ROOT && changed(m) > changed(mine)) {
      const children = mine.children;
      for (const k of Object.keys(mine)) delete mine[k];
      Object.assign(mine, m, { children });
      took = true;
    }
  }
  for (const [id, m] of Object.entries(other.messages)) {
    const kids = conv.messages[id].children;
    const missing = m.children.filter((c) => !kids.includes(c));
    if (missing.length) {
      kids.push(...missing);
      kids.sort((a, b) => (conv.messages[a].created || 0) - (conv.messages[b].created || 0));
    }
  }
  if ((other.meta || 0) > (conv.meta || 0)) {
    for (const k of META) conv[k] = other[k];
    conv.meta = other.meta;
    took = true;
  }
  conv.updated = Math.max(conv.updated || 0, other.updated || 0);
  if (took) show(conv, conv.current); // the branch on screen goes on to what was added under its last message
  return took;
}

const ROLES = new Set(["user", "assistant"]);

/** Why a conversation as this browser keeps it (a pending note in localStorage, a record in IndexedDB) cannot be
 * shown or added to, or "" when it can: its root, every message its messages name, each under the parent it
 * names and reaching the root up its parents, and the branch on screen. A record set by hand or cut off is
 * refused, never half drawn. */
export function damage(conv) {
  if (!conv || typeof conv !== "object") return "it is not a conversation";
  const messages = conv.messages;
  if (!messages || typeof messages !== "object" || !Object.hasOwn(messages, ROOT)) return "it has no root message";
  const held = new Set(); // the messages a parent names as its child (each checked to name that parent)
  for (const [id, m] of Object.entries(messages)) {
    if (!m || typeof m !== "object" || !Array.isArray(m.children)) return `message ${id} is not a message`;
    for (const child of m.children) {
      const c = Object.hasOwn(messages, child) ? messages[child] : null;
      if (!c || typeof c !== "object" || c.parent !== id || c.id !== child) return `message ${child} is missing`;
      if (!ROLES.has(c.role) || typeof c.content !== "string") return `message ${child} is not a user's or an answer`;
      held.add(child);
    }
  }
  // parents that go round in a loop would make a branch through them endless (path, show): each message is walked
  // up to one known to reach the root, so the whole check is one pass however long the conversation
  const rooted = new Set([ROOT]);
  for (const id of Object.keys(messages)) {
    const walk = new Set();
    for (let at = id; !rooted.has(at); at = messages[at].parent) {
      if (walk.has(at)) return `message ${id} does not reach the first message: its parents go round in a loop`;
      if (!held.has(at)) return `message ${at} is under no message`;
      walk.add(at);
    }
    for (const w of walk) rooted.add(w);
  }
  if (typeof conv.current !== "string" || !Object.hasOwn(messages, conv.current)) {
    return "the message on screen is missing";
  }
  return "";
}

const IMAGE = /^data:image\/[a-z0-9.+-]+;base64,[A-Za-z0-9+/=]+$/;

function text(value, what) {
  if (value === undefined || value === null) return "";
  if (typeof value !== "string") throw new Error(`${what} is not text`);
  return value;
}

/** A conversation read from an export, checked field by field and rebuilt from what a page writes: a file
 * that is not one is an Error saying why (nothing of it is kept). It gets a new id, so that importing never
 * replaces a conversation already here. */
export function imported(doc) {
  if (!doc || typeof doc !== "object" || !doc.messages || typeof doc.messages !== "object") {
    throw new Error("a conversation has no messages");
  }
  const conv = conversation();
  conv.name = text(doc.name, "name").slice(0, 200);
  conv.system = text(doc.system, "system");
  conv.model = doc.model === null || doc.model === undefined ? null : text(doc.model, "model");
  for (const key of SETTINGS) {
    const v = doc.settings ? doc.settings[key] : null;
    if (v !== null && v !== undefined && (typeof v !== "number" || !Number.isFinite(v))) {
      throw new Error(`the setting ${key} is not a number`);
    }
    conv.settings[key] = v === undefined ? null : v;
  }
  conv.tools = toolSettings(doc);
  conv.documents = documentSettings(doc);
  for (const k of ["created", "updated"]) if (Number.isFinite(doc[k])) conv[k] = doc[k];
  const ids = new Map([[ROOT, ROOT]]); // old id → new id
  const source = doc.messages;
  if (!source[ROOT]) throw new Error("a conversation has no root message");
  const todo = [ROOT]; // a stack, not recursion: a conversation of many thousand turns imports too
  while (todo.length) {
    const oldId = todo.pop();
    const m = source[oldId];
    if (!m || typeof m !== "object" || !Array.isArray(m.children)) throw new Error(`message ${oldId} is missing`);
    for (const child of m.children) {
      if (ids.has(child)) throw new Error(`message ${child} appears twice`);
      const c = source[child];
      if (!c || typeof c !== "object" || !ROLES.has(c.role)) throw new Error(`message ${child} is not a user's or an answer`);
      const images = c.images === undefined ? [] : c.images;
      if (!Array.isArray(images) || !images.every((i) => typeof i === "string" && IMAGE.test(i))) {
        throw new Error(`message ${child} has an image that is not a data: URI`);
      }
      const copy = add(conv, ids.get(oldId), { role: c.role, content: text(c.content, "a message") });
      if (images.length) copy.images = images;
      if (c.role === "assistant") answerFields(copy, c);
      if (Number.isFinite(c.created)) copy.created = c.created;
      ids.set(child, copy.id);
    }
    for (let k = m.children.length - 1; k >= 0; k--) todo.push(m.children[k]);
  }
  if (typeof doc.current === "string" && ids.has(doc.current)) conv.current = ids.get(doc.current);
  else show(conv, ROOT);
  if (Number.isFinite(doc.updated)) conv.updated = doc.updated;
  return conv;
}

const ERRORS = new Set(["network", "interrupted", "auth", "context", "size", "refused"]);

/** What an answer of an export says besides its text: its reasoning, model, stats, and the note under it
 * (stopped, cut at max_tokens, edited, or the error it met), checked, so that it reads as it did. */
function answerFields(copy, c) {
  copy.reasoning = text(c.reasoning, "reasoning");
  copy.model = c.model === undefined || c.model === null ? null : text(c.model, "model");
  for (const k of ["stats", "note"]) if (c[k] && typeof c[k] === "object") copy[k] = sanitized(c[k]);
  if (c.stopped === true) copy.stopped = true;
  if (c.edited === true) copy.edited = true;
  if (typeof c.finish === "string" && c.finish.length < 40) copy.finish = c.finish;
  const e = c.error;
  if (typeof e === "string" && e) copy.error = { kind: "refused", message: e.slice(0, 2000) };
  else if (e && typeof e === "object" && typeof e.message === "string") {
    copy.error = { kind: ERRORS.has(e.kind) ? e.kind : "refused", message: e.message.slice(0, 2000) };
  }
  if (c.sources !== undefined) copy.sources = sources(c.sources);
  if (c.rounds !== undefined) {
    if (!Array.isArray(c.rounds)) throw new Error("an answer's tool rounds are not a list");
    const rounds = c.rounds.map(round);
    if (rounds.length) copy.rounds = rounds;
  }
}

/** The excerpts an answer was sent from the conversation's documents: [{id, store, score, text}], best first
 * (store: the collection it came from, null in an answer kept before the page said). */
function sources(list) {
  if (!Array.isArray(list) || list.length > 64) throw new Error("an answer's sources are not a list");
  return list.map((x) => {
    if (!x || typeof x !== "object" || typeof x.id !== "string") throw new Error("a source has no id");
    const store = typeof x.store === "string" ? x.store.slice(0, 200) : null;
    return { id: x.id.slice(0, 2000), store, score: Number.isFinite(x.score) ? x.score : null,
      text: text(x.text, "a source") };
  });
}

/** One tool round of an answer, as the page keeps it: what the model said, then its calls and their results. */
function round(r) {
  if (!r || typeof r !== "object" || !Array.isArray(r.tool_calls)) throw new Error("a tool round has no calls");
  const results = r.results === undefined ? [] : r.results;
  if (!Array.isArray(results)) throw new Error("a tool round's results are not a list");
  const calls = r.tool_calls.map((t) => {
    const f = t && t.function;
    if (!f || typeof t.id !== "string" || typeof f.name !== "string") throw new Error("a tool call has no id or name");
    const args = text(f.arguments, "a tool call's arguments");
    return { id: t.id, type: "function", function: { name: f.name, arguments: args } };
  });
  const ids = new Set(calls.map((t) => t.id));
  return {
    content: text(r.content, "a tool round"),
    reasoning: text(r.reasoning, "a tool round's reasoning"),
    tool_calls: calls,
    results: results.map((x) => {
      if (!x || typeof x !== "object" || !ids.has(x.tool_call_id)) throw new Error("a tool result answers no call");
      const out = { tool_call_id: x.tool_call_id, content: text(x.content, "a tool result") };
      if (x.is_error === true) out.is_error = true;
      if (x.declined === true) out.declined = true;
      return out;
    }),
  };
}

function sanitized(obj) {
  // numbers and short strings only: what the page's own stats and notes hold
  const out = {};
  for (const [k, v] of Object.entries(obj)) {
    if ((typeof v === "number" && Number.isFinite(v)) || (typeof v === "string" && v.length < 500)) out[k] = v;
  }
  return out;
}
