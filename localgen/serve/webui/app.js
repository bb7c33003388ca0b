// The chat page: the conversation on screen and its branches, the composer, the model picker, the
// conversation list, settings, the key prompt, the server's tools (an answer's rounds of calls), and its
// documents (an answer's sources).
// Everything the model writes reaches the page through markdown.js (DOM nodes, never HTML); every call to
// the server goes through api.js.

import * as api from "./api.js";
import { render as markdown, streamer } from "./markdown.js";
import * as store from "./store.js";
import * as transcript from "./transcript.js";
import * as tree from "./tree.js";

const $ = (id) => document.getElementById(id);
const MAX_IMAGE_BYTES = 10 * 1024 * 1024;
const REACH_RETRY_MS = 5000; // how often the page asks again for a server out of reach
const MAX_IMPORT_BYTES = 64 * 1024 * 1024; // a file to import: read whole, then parsed, so bounded first
const SAVE_EVERY_MS = 1500; // while an answer streams, what came so far is kept this often (a reload keeps it)
const MODEL_KEY = "localgen.model";
// the settings of the new conversation on screen (no message yet, so not kept in IndexedDB), chosen in Settings:
// a reload brings them back, until its first question keeps the conversation or New chat starts another
const DRAFT_KEY = "localgen.draft";
const MAX_TOOL_ROUNDS = 8; // rounds of calls in one answer, as run's and chat's --tool-steps
const DECLINED = "The user declined to run this tool call."; // what the model is told, as chat tells it
const LONG_RESULT = 400; // characters (or 8 lines) past which a tool's result is shown folded

const ui = {
  app: $("app"), messages: $("messages"), empty: $("empty"), input: $("input"), send: $("send"), stop: $("stop"),
  model: $("model"), note: $("model-note"), list: $("conversations"), banner: $("banner"),
  bannerText: $("banner-text"), bannerRetry: $("banner-retry"), attach: $("attach"), attachFile: $("attach-file"),
  attachments: $("attachments"), settings: $("settings"), keyDialog: $("key-dialog"),
};

const state = {
  conv: tree.conversation(), // the conversation on screen (kept once it has a message)
  models: [], // /v1/models
  modelsFailed: null, // why /v1/models could not be listed (its ApiError), its last time (null: it was)
  picked: null, // the model picked last on this page (also kept in localStorage, where it can be)
  loaded: new Set(), // the models loaded now, as /models said last
  loadedKnown: false, // whether /models has answered yet (until then the note says nothing)
  vision: null, // whether the picked model takes images (null: unknown, so the page lets you try)
  chats: null, // whether it has a chat template (false: a base model, whose chats the server refuses)
  capsOf: null, // the model `vision` and `chats` are of
  running: null, // {controller, conv, answer, calls, asking, calling} while an answer streams or runs its tools
  tools: null, // the server's tools (/tools): a list, [] with none, null when it could not say
  toolsError: "", // why /tools could not be read
  stores: null, // the server's vector stores (/v1/vector_stores: serve --collection): a list, [] with none, null unknown
  storesError: "", // why /v1/vector_stores could not be read
  loading: null, // the model an answer waits for while it loads (until its first words)
  attachments: [], // data: URIs of the images waiting to be sent
  views: new Map(), // message id → the function that redraws it, for the messages on screen
  dirty: new Set(),
  frame: 0,
  deleted: new Set(), // ids deleted here: an answer still ending must not write its conversation back
  leaving: false, // the page is being closed or reloaded (pagehide): the streams it cuts are no lost connection
  settingsFrom: null, // the settings dialog's fields as it opened (settingsForm)
};

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function button(label, className, onClick, aria) {
  const b = el("button", className, label);
  b.type = "button";
  if (aria) b.setAttribute("aria-label", aria);
  b.addEventListener("click", onClick);
  return b;
}

// ---- banner: what is wrong with the page as a whole (the server gone, no key), or a short notice. Each says what
// it is about, and goes when that clears: "models" when the models are listed, "write" when a conversation is kept,
// "read" when the store is read, a "notice" (of an import, an attachment, a conversation not shown) at the next
// thing the user does (send, open a conversation, start a new one).

let retry = null;
let about = null; // what the banner on screen is about
let reachTimer = null; // watchReach's interval while the server is out of reach

function banner(message, again = null, kind = "error", subject = "notice") {
  ui.bannerText.textContent = message;
  ui.banner.className = kind;
  ui.banner.hidden = false;
  retry = again;
  about = subject;
  ui.bannerRetry.hidden = again === null;
}

/** Hides the banner (when `subject` is given: only a banner about that). */
function clearBanner(subject = null) {
  if (subject !== null && about !== subject) return;
  ui.banner.hidden = true;
  retry = null;
  about = null;
}

// ---- this browser's localStorage, which may be full or turned off: a pick or a draft not kept is no error

function readLocal(key) {
  try {
    return localStorage.getItem(key);
  } catch {
    return null;
  }
}

/** Keeps `value` under `key` (null: forgets it); false when the browser would not. */
function writeLocal(key, value) {
  try {
    if (value === null) localStorage.removeItem(key);
    else localStorage.setItem(key, value);
    return true;
  } catch {
    return false;
  }
}

// ---- the API key

function askKey(reason) {
  const dialog = ui.keyDialog;
  const input = $("key-input");
  $("key-reason").textContent = reason;
  $("key-error").hidden = true;
  input.value = "";
  return new Promise((resolve) => {
    const done = (value) => {
      $("key-form").onsubmit = null;
      $("key-cancel").onclick = null;
      dialog.oncancel = null;
      if (dialog.open) dialog.close();
      if (value) ui.input.focus(); // back to the message box, whatever had the focus before the question
      resolve(value);
    };
    $("key-form").onsubmit = (e) => {
      e.preventDefault();
      const typed = input.value.trim();
      const wrong = unsendable(typed);
      $("key-error").textContent = wrong;
      $("key-error").hidden = !wrong;
      if (wrong) input.focus();
      else done(typed || null);
    };
    $("key-cancel").onclick = () => done(null);
    dialog.oncancel = (e) => {
      e.preventDefault();
      done(null);
    };
    dialog.showModal();
    input.focus();
  });
}

/** Why a browser cannot send this key in a header (a character past Latin-1: a typographic quote, an
 * invisible space pasted with it), or "" when it can. */
function unsendable(key) {
  try {
    new Headers().set("Authorization", `Bearer ${key}`);
    return "";
  } catch {
    const odd = [...key].find((ch) => ch.codePointAt(0) > 0xff || ch.codePointAt(0) < 0x20);
    const code = odd ? `U+${odd.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")}` : "";
    return `That key holds a character a browser cannot send${code ? ` (${code})` : ""}, such as a typographic `
      + "quote or an invisible space copied with it: type or paste the key again.";
  }
}

// ---- models

async function loadModels() {
  let models;
  try {
    models = await api.models();
  } catch (e) {
    // the server out of reach: said until any call reaches it again (onReached), not only this one
    state.modelsFailed = e; // what a send says then (no model is listed because of it: no key, ...)
    banner(e.message, loadModels, "error", e.kind === "network" ? "reach" : "models");
    ui.note.textContent = "";
    if (e.kind === "network") watchReach();
    return;
  }
  clearBanner("models"); // its own complaint: another (a conversation not found) stays
  state.modelsFailed = null;
  state.models = models;
  await Promise.all([loadTools(), loadStores()]);
  const offered = new Set(models.map((m) => m.id));
  const previous = ui.model.value;
  ui.model.replaceChildren(...models.map((m) => {
    const option = el("option", null, m.id);
    option.value = m.id;
    return option;
  }));
  const remembered = readLocal(MODEL_KEY);
  const fallback = models.find((m) => m.default) || models[0];
  const pick = [state.conv.model, previous, remembered, fallback && fallback.id].find((n) => n && offered.has(n));
  if (pick) ui.model.value = pick;
  if (!models.length) {
    banner("The server offers no model: pull one with localgen pull, then Retry.", loadModels, "error", "models");
  }
  await modelChanged(false);
}

/** While the server is out of reach, ask again every REACH_RETRY_MS (the page visible, no answer coming): the
 * banner goes once it is back, without a press of Retry. */
function watchReach() {
  if (reachTimer !== null) return;
  let asking = false; // one ask at a time: a server that hangs rather than refuses would pile them up
  reachTimer = setInterval(() => {
    if (about !== "reach" || ui.banner.hidden) {
      clearInterval(reachTimer);
      reachTimer = null;
    } else if (document.visibilityState === "visible" && !state.running && !asking) {
      asking = true;
      loadModels().finally(() => { asking = false; });
    }
  }, REACH_RETRY_MS);
}

async function loadTools() {
  try {
    state.tools = await api.tools();
    state.toolsError = "";
  } catch (e) {
    state.tools = null;
    state.toolsError = e.message || String(e);
  }
}

async function loadStores() {
  try {
    state.stores = await api.vectorStores();
    state.storesError = "";
  } catch (e) {
    state.stores = null;
    state.storesError = e.message || String(e);
  }
}

/** The tools a request of `conv` offers the model (the server's, without their source), or null: none. */
function offeredTools(conv) {
  if (!state.tools || !state.tools.length || tree.toolSettings(conv).mode === "off") return null;
  return state.tools.map((t) => ({ type: "function", function: t.function }));
}

function windowOf(name) {
  const m = state.models.find((x) => x.id === name);
  return m ? m.max_model_len : null;
}

async function modelChanged(chosen) {
  const name = ui.model.value;
  if (!name) return;
  if (state.capsOf !== name) { // another model's: unknown until /api/show answers for this one
    state.vision = state.chats = null;
    state.capsOf = name;
  }
  if (chosen) {
    state.picked = name; // the pick holds for the page even where the browser cannot keep it (storage full or off)
    writeLocal(MODEL_KEY, name);
    state.conv.model = name;
    state.conv.meta = Date.now();
    if (hasMessages(state.conv)) persist(state.conv);
  }
  showNote();
  const [loaded, caps] = await Promise.allSettled([api.loaded(), api.capabilities(name)]);
  if (ui.model.value !== name) return; // another was picked meanwhile
  if (loaded.status === "fulfilled") {
    state.loaded = loaded.value;
    state.loadedKnown = true;
  }
  state.vision = caps.status === "fulfilled" ? caps.value.includes("vision") : null;
  state.chats = caps.status === "fulfilled" ? caps.value.includes("chat") : null;
  ui.attach.disabled = state.vision === false;
  ui.attach.title = {
    true: `Attach an image for ${name}`,
    false: `${name} takes no images`,
    null: `Attach an image (the server did not say whether ${name} takes images)`,
  }[String(state.vision)];
  showNote();
}

/** The /v1/models entry of a model another server runs (serve --endpoint), else undefined: nothing loads here. */
function remoteOf(name) {
  return state.models.find((m) => m.id === name && m.upstream);
}

function showNote() {
  const name = ui.model.value;
  if (!name) {
    ui.note.textContent = "";
    return;
  }
  const remote = remoteOf(name);
  if (remote) {
    ui.note.className = "";
    ui.note.textContent = `on ${remote.owned_by}`;
    return;
  }
  const loading = state.loading === name;
  if (state.chats === false && !loading) { // a base model: the server refuses its chat (no chat template)
    ui.note.className = "warning";
    ui.note.textContent = "a base model, with no chat template: it cannot chat; pick another";
    return;
  }
  ui.note.className = loading ? "loading" : "";
  if (loading) ui.note.textContent = `Loading ${name}…`;
  else if (!state.loadedKnown) ui.note.textContent = "";
  else if (state.loaded.has(name)) ui.note.textContent = "loaded";
  else ui.note.textContent = "not loaded yet: the first message loads it";
}

// ---- the conversation list

function hasMessages(conv) {
  return conv.messages[tree.ROOT].children.length > 0;
}

/** A new conversation's settings kept (DRAFT_KEY) for a reload: its name, system prompt, sampling, tools and
 * documents. */
function keepDraft(conv) {
  const { id, name, system, settings, tools, documents } = conv;
  // a browser that keeps nothing (storage full or off): the settings stay for this page only
  writeLocal(DRAFT_KEY, JSON.stringify({ id, name, system, settings, tools, documents }));
}

/** The new conversation a reload comes back to: the kept settings, checked as an import's are; null when none
 * (or what was kept is not a conversation's settings: then dropped). */
function draftConversation() {
  const raw = readLocal(DRAFT_KEY);
  if (!raw) return null;
  try {
    const d = JSON.parse(raw);
    const conv = tree.imported({ ...d, messages: { [tree.ROOT]: { children: [] } } });
    if (typeof d.id === "string" && /^[\w-]{1,100}$/.test(d.id)) conv.id = d.id;
    return conv;
  } catch {
    writeLocal(DRAFT_KEY, null);
    return null;
  }
}

/** Forget the kept settings of a new conversation (of `id` only, when given): it was kept, or replaced. */
function dropDraft(id = null) {
  try {
    const d = JSON.parse(readLocal(DRAFT_KEY) || "null");
    if (d && (id === null || d.id === id)) writeLocal(DRAFT_KEY, null);
  } catch {
    writeLocal(DRAFT_KEY, null);
  }
}

/** Keeps `conv` in this browser; false (and a banner says why) when the browser would not. */
async function persist(conv) {
  if (state.deleted.has(conv.id)) return true;
  let took;
  try {
    took = await store.save(conv, tree.merge);
  } catch (e) {
    banner(`This browser would not keep the conversation: ${e.message || e}`, null, "error", "write");
    return false;
  }
  clearBanner("write"); // kept now, with what an earlier write could not keep
  if (took && conv === state.conv) {
    watchOthers(conv); // another tab had added to it: an answer it writes among what it added
    if (!editing()) renderConversation();
  }
  return true;
}

function editing() {
  return ui.messages.querySelector(".editor") !== null;
}

// Another tab of this page wrote or deleted a conversation: the list shows it, and so does the screen.
async function heard(news) {
  if (news.kind === "removed") {
    state.deleted.add(news.id);
    if (state.running && state.running.conv.id === news.id) stop();
    if (state.conv.id === news.id) {
      newChat();
      banner("The conversation on screen was deleted in another tab.", null, "info");
    }
  } else if (news.id === state.conv.id && !(state.running && state.running.conv.id === news.id)) {
    const stored = await store.get(news.id);
    if (stored && tree.merge(state.conv, stored)) {
      watchOthers(state.conv); // an answer that tab writes now: said to be cut short if that tab goes first
      if (!editing()) renderConversation();
    }
  }
  refreshList();
}

async function refreshList(renamed = false) {
  // a name being edited is not drawn over (what was typed would be lost): its rename draws the list when it ends
  const editingName = document.activeElement;
  if (!renamed && editingName && editingName.classList.contains("rename") && ui.list.contains(editingName)) return;
  let all;
  try {
    all = await store.all();
  } catch (e) {
    banner(`This browser's storage (IndexedDB) cannot be read: ${e.message || e}`, null, "error", "read");
    return;
  }
  clearBanner("read");
  // the list is drawn again whole: a control of it that had the focus gets it back (a name being edited: the name)
  const a = document.activeElement;
  const had = a && ui.list.contains(a) ? a.closest("li") : null;
  const at = had ? [...ui.list.children].indexOf(had) : -1;
  const part = had && a.dataset.key ? a.dataset.key : "open";
  ui.list.replaceChildren(...all.map(listItem));
  $("export-all").disabled = all.length === 0;
  showTitle();
  if (had) {
    const items = [...ui.list.children];
    // the same conversation's control; one deleted: the one now in its place, or the last; none left: the message box
    const li = items.find((x) => x.dataset.id === had.dataset.id) || items[Math.min(at, items.length - 1)];
    const to = li && (li.querySelector(`[data-key="${li.dataset.id === had.dataset.id ? part : "open"}"]`));
    (to || ui.input).focus();
  }
}

function listItem(conv) {
  const li = el("li", conv.id === state.conv.id ? "conv active" : "conv");
  li.dataset.id = conv.id;
  const name = conv.name || "Untitled";
  const open = button(name, "open", () => openConversation(conv.id));
  open.title = name;
  open.dataset.key = "open";
  if (conv.id === state.conv.id) open.setAttribute("aria-current", "true");
  const rename = button("✎", "icon small", () => renameInline(li, open, conv), `Rename ${name}`);
  rename.dataset.key = "rename";
  const remove = button("✕", "icon small", () => deleteConversation(conv, li), `Delete ${name}`);
  remove.dataset.key = "delete";
  li.append(open, rename, remove);
  return li;
}

function renameInline(li, open, conv) {
  const input = el("input", "rename");
  input.value = conv.name;
  input.setAttribute("aria-label", "New name");
  open.replaceWith(input);
  input.focus();
  input.select();
  let finished = false;
  const finish = async (keep) => {
    if (finished) return;
    finished = true;
    if (keep) await rename(conv.id, input.value);
    refreshList(true);
  };
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter") finish(true);
    if (e.key === "Escape") {
      e.stopPropagation();
      finish(false);
    }
  });
  input.addEventListener("blur", () => finish(true));
}

async function rename(id, name) {
  const live = [state.conv, state.running && state.running.conv].find((c) => c && c.id === id);
  const conv = live || await store.get(id);
  if (!conv) return;
  conv.name = name.trim().slice(0, 200);
  conv.meta = Date.now();
  await persist(conv);
}

/** Deletes `conv` once confirmed; from the list (its item `from`), the focus goes to the item then in its place. */
async function deleteConversation(conv, from = null) {
  const at = from ? [...ui.list.children].indexOf(from) : -1; // before the question: the focus may leave meanwhile
  if (!window.confirm(`Delete “${conv.name || "Untitled"}”? This cannot be undone.`)) return;
  if (state.running && state.running.conv.id === conv.id) stop();
  state.deleted.add(conv.id);
  await store.remove(conv.id);
  const open = conv.id === state.conv.id;
  if (open) newChat(); // the message box has the focus
  await refreshList();
  if (at >= 0 && !open) {
    const items = [...ui.list.children];
    const li = items[Math.min(at, items.length - 1)];
    (li ? li.querySelector('[data-key="open"]') : ui.input).focus();
  }
}

let opening = 0; // the latest openConversation: one overtaken while it asked the other tabs shows nothing

async function openConversation(id) {
  const ticket = ++opening;
  const before = state.conv;
  const conv = await store.get(id);
  if (!conv) {
    newChat();
    banner("That conversation is no longer in this browser.");
    return;
  }
  const damage = tree.damage(conv);
  if (damage) {
    newChat();
    banner(`That conversation cannot be shown: what this browser keeps of it is damaged (${damage}). `
      + "Delete it, or keep it as it is with Export all.");
    return;
  }
  if (state.running && state.running.conv.id === id) {
    show(state.running.conv);
  } else {
    const pending = Object.values(conv.messages).filter((m) => m.pending);
    const coming = await Promise.all(pending.map((m) => answering(m.id))); // asked at once, not one after another
    pending.forEach((m, i) => {
      if (!coming[i]) { // no tab is writing it: it was cut short (one another tab still writes stays unfinished)
        m.pending = false;
        m.error = interrupted();
      } else {
        watch(id, m.id); // until that tab ends it, or is closed first
      }
    });
    if (ticket !== opening || state.conv !== before) return; // another conversation was opened meanwhile
    show(conv);
  }
  closeSidebar();
}

// The tab writing an answer holds a lock named for it (Web Locks, across this page's tabs) until the answer ends;
// the browser lets it go when that tab is closed or reloaded. So an unfinished answer whose lock is free was cut
// short, and one whose lock is held is still coming in another tab. A page without Web Locks (over plain http from
// another machine) asks the other tabs instead (BroadcastChannel): one no tab claims within ASK_MS was cut short.
const ANSWERING = "localgen-answering:";
const ASK_MS = 500;
let answers = null; // the channel the tabs without Web Locks ask on (listenForAsks sets it)
const writing = new Set(); // the answers this tab is writing, until each is kept as ended

/** Holds the lock of answer `id` until `ended` settles (without Web Locks, the tab claims it when asked). */
async function holdAnswer(id, ended) {
  writing.add(id);
  ended.then(() => writing.delete(id));
  if (!navigator.locks) return;
  await new Promise((held) => {
    navigator.locks.request(ANSWERING + id, () => {
      held();
      return ended;
    }).catch(() => held());
  });
}

/** Whether another tab is writing answer `id` now (it holds the answer's lock, or claims it when asked). */
async function answering(id) {
  if (navigator.locks) {
    try {
      return await navigator.locks.request(ANSWERING + id, { ifAvailable: true }, (lock) => lock === null);
    } catch {
      return false;
    }
  }
  if (!answers) return false;
  return new Promise((resolve) => {
    const heard = (e) => {
      if (e.data && e.data.writing === id) done(true);
    };
    const done = (yes) => {
      clearTimeout(timer);
      answers.removeEventListener("message", heard);
      resolve(yes);
    };
    const timer = setTimeout(() => done(false), ASK_MS);
    answers.addEventListener("message", heard);
    answers.postMessage({ asks: id });
  });
}

/** Once no tab writes answer `id` of conversation `convId` (the writing tab ended it, or was closed, reloaded or
 * crashed first), one still unfinished in the store was cut short: shown so, if it is on screen. Without Web Locks
 * the tabs are asked every WATCH_MS while the conversation is on screen. */
async function watchAnswer(convId, id) {
  if (navigator.locks) {
    try {
      await navigator.locks.request(ANSWERING + id, () => {}); // granted once the writing tab lets it go
    } catch {
      return;
    }
  } else {
    if (watching.has(id)) return; // opened again meanwhile: one loop asks
    watching.add(id);
    try {
      do {
        await new Promise((wait) => setTimeout(wait, WATCH_MS));
        if (state.conv.id !== convId) return;
      } while (await answering(id));
    } finally {
      watching.delete(id);
    }
  }
  const stored = await store.get(convId).catch(() => null);
  const kept = stored && stored.messages && stored.messages[id];
  if (kept && !kept.pending) return; // it ended and was kept: the tab that wrote it said so (heard)
  const shown = state.conv.id === convId && state.conv.messages[id];
  if (!shown || !shown.pending) return;
  shown.pending = false;
  shown.error = interrupted();
  schedule(shown); // its own redraw: during an answer this tab writes, and beside an edit open on another message
}
const WATCH_MS = 2000;
const watching = new Set(); // the answers asked about every WATCH_MS (without Web Locks)
const watched = new Set(); // the answers watchAnswer waits on now: one wait each

/** Watches answer `id` of conversation `convId` (watchAnswer), unless it is watched already. */
function watch(convId, id) {
  if (watched.has(id)) return;
  watched.add(id);
  watchAnswer(convId, id).finally(() => watched.delete(id));
}

/** Watches each unfinished answer of `conv` that another tab writes: one learned of from that tab (merged) as well
 * as one found on opening, so that its tab closed or reloaded, it is said to be cut short. */
function watchOthers(conv) {
  for (const m of Object.values(conv.messages)) {
    if (m.pending && !writing.has(m.id)) watch(conv.id, m.id);
  }
}

/** This tab claims the answer it is writing when another tab asks. */
function listenForAsks() {
  if (typeof BroadcastChannel !== "function") return;
  answers = new BroadcastChannel(ANSWERING);
  answers.addEventListener("message", (e) => {
    const id = e.data && e.data.asks;
    if (id && writing.has(id)) answers.postMessage({ writing: id });
  });
}

/** The note of an answer that was still coming when its page was closed or reloaded. */
function interrupted() {
  return { kind: "interrupted", message: "The answer was interrupted: the page was closed or reloaded while it came." };
}

function show(conv) {
  clearBanner("notice");
  state.conv = conv;
  history.replaceState(null, "", hasMessages(conv) ? `#${conv.id}` : location.pathname);
  if (conv.model && state.models.some((m) => m.id === conv.model) && ui.model.value !== conv.model) {
    ui.model.value = conv.model;
    modelChanged(false);
  }
  renderConversation();
  refreshList();
}

function newChat() {
  clearBanner("notice");
  dropDraft();
  state.conv = tree.conversation();
  // the model picked last (remembered when picked), not the one of the conversation that was on screen
  const picked = state.picked || readLocal(MODEL_KEY);
  if (picked && picked !== ui.model.value && state.models.some((m) => m.id === picked)) {
    ui.model.value = picked;
    modelChanged(false);
  }
  state.conv.model = ui.model.value || null;
  history.replaceState(null, "", location.pathname);
  renderConversation();
  refreshList();
  closeSidebar();
  ui.input.focus();
}

// ---- messages on screen

function renderConversation() {
  const focus = focusInMessages();
  state.views.clear();
  const path = tree.path(state.conv);
  ui.messages.replaceChildren(...(path.length ? path.map(messageView) : [ui.empty]));
  showTitle();
  scrollToEnd();
  if (focus) focus();
}

/** Where the focus is among the messages, as a function that puts it back on the same control once they are drawn
 * again (the same button of the same message, else the same place among its controls); null when it is not there. */
function focusInMessages() {
  const a = document.activeElement;
  const article = a && ui.messages.contains(a) ? a.closest("article.msg") : null;
  if (!article) return null;
  const { id } = article.dataset;
  const key = a.dataset.key;
  const index = [...article.querySelectorAll(FOCUSABLE)].indexOf(a);
  return () => {
    const again = articleOf(id);
    if (!again || again.contains(document.activeElement)) return;
    if (key) focusTool(id, key, "copy");
    else if (a === article) again.focus();
    else if (index >= 0) (again.querySelectorAll(FOCUSABLE)[index] || again).focus();
  };
}
const FOCUSABLE = "a[href], button:not(:disabled), summary, textarea, input, [tabindex]:not([tabindex='-1'])";

/** The page's heading names the conversation on screen (read by screen readers; the empty page has its own). */
function showTitle() {
  const title = $("conv-title");
  title.hidden = !hasMessages(state.conv);
  title.textContent = state.conv.name || "Untitled conversation";
}

function messageView(m) {
  const article = el("article", `msg ${m.role}`);
  article.dataset.id = m.id;
  article.tabIndex = -1; // focused where the keyboard's control went (a Regenerate: the new answer)
  // who wrote it, for screen readers: the article's name, and a heading to jump between messages
  const who = el("h2", "who visually-hidden", m.role === "user" ? "You" : m.model || "The model");
  who.id = `who-${m.id}`;
  article.setAttribute("aria-labelledby", who.id);
  article.append(who);
  const tools = el("div", "msg-tools");
  if (m.role === "user") {
    const bubble = el("div", "bubble");
    for (const src of m.images || []) {
      const img = el("img", "attached");
      img.src = src;
      img.alt = "attached image";
      bubble.append(img);
    }
    bubble.append(el("div", "text", m.content));
    article.append(bubble, tools);
    fillTools(tools, m);
    return article;
  }
  const sources = el("div", "sources-slot");
  const rounds = el("div", "rounds");
  const reasoning = el("details", "reasoning");
  const summary = el("summary");
  const thought = el("div", "reasoning-text");
  reasoning.append(summary, thought);
  const body = el("div", "body markdown");
  const live = el("div", "tool-calls"); // the calls of the round that streams now
  const note = el("div", "note"); // not a live region: what it says is announced with the answer (announce)
  article.append(sources, rounds, reasoning, body, live, note, tools);
  const drawn = [];
  const draw = streamer(body); // while the answer streams, only its last block is drawn again
  let drawnSources = null;
  const redraw = () => {
    const key = m.sources ? m.sources.map((x) => x.id).join("\n") + `|${m.sources.length}` : null;
    if (key !== drawnSources) { // drawn again only when they change, so an excerpt opened stays open
      drawnSources = key;
      sources.replaceChildren(...(m.sources ? [sourcesView(m.sources)] : []));
    }
    drawRounds(m, rounds, drawn);
    const run = runOf(m);
    const calls = run ? run.calls.filter(Boolean) : [];
    reasoning.hidden = !m.reasoning;
    summary.textContent = m.pending && !m.content ? "Thinking…" : "Reasoning";
    thought.textContent = m.reasoning || "";
    const waiting = run && (run.asking || run.calling || calls.length);
    if (m.content) {
      const added = draw(m.content, !m.pending);
      if (m.sources && m.sources.length) for (const node of added) cite(node, m.sources, article);
    } else {
      draw("", true);
      body.replaceChildren(...(m.pending && !waiting ? [typing()] : []));
    }
    live.replaceChildren(...calls.map((c) => callBlock(c, null, "writing")));
    article.classList.toggle("pending", Boolean(m.pending));
    if (m.pending) article.setAttribute("aria-busy", "true"); // screen readers wait for the whole answer
    else article.removeAttribute("aria-busy");
    note.replaceChildren(...noteOf(m));
    note.className = m.error ? "note error" : "note";
    fillTools(tools, m);
  };
  state.views.set(m.id, redraw);
  redraw();
  return article;
}

function typing() {
  const dots = el("span", "typing", "…");
  dots.setAttribute("role", "img");
  dots.setAttribute("aria-label", "The answer is coming");
  return dots;
}

/** Says `text` once to screen readers (the polite live region): an answer that ended, not each of its words. */
function announce(text) {
  const region = $("announce");
  region.textContent = "";
  setTimeout(() => {
    region.textContent = text;
  }, 50); // emptied first: the same words twice are said twice
}

/** What is said when an answer ends: the model, its words (up to ANNOUNCED characters) and its note. */
function answerSaid(m) {
  const article = articleOf(m.id);
  const words = article ? article.querySelector(".body").textContent.trim() : m.content.trim();
  const cut = words.length > ANNOUNCED ? `${words.slice(0, ANNOUNCED)}… (more in the answer)` : words;
  const note = noteOf(m).map((n) => n.textContent).join(" ");
  const who = m.model || "The model";
  return cut ? [`${who} answered:`, cut, note].filter(Boolean).join(" ") : `${who}: ${note || "no answer."}`;
}
const ANNOUNCED = 1000;

/** The excerpts of the documents an answer was sent: each its number, id, collection and score, its text folded. */
function sourcesView(list) {
  const box = el("section", "sources");
  box.setAttribute("aria-label", "Sources");
  if (!list.length) {
    box.append(el("div", "sources-head", "No excerpt of the documents was sent with this question."));
    return box;
  }
  box.append(el("div", "sources-head", `Sources (${list.length})`));
  list.forEach((x, k) => {
    const d = el("details", "source");
    const summary = el("summary");
    const id = el("code", "source-id", x.id);
    id.title = x.id; // a long id is cut on its line: all of it on hover
    summary.append(el("span", "source-n", `[${k + 1}]`), id);
    if (x.store) summary.append(el("span", "source-store", x.store));
    if (Number.isFinite(x.score)) summary.append(el("span", "source-score", x.score.toFixed(3)));
    d.append(summary, el("div", "source-text", x.text));
    box.append(d);
  });
  return box;
}

/** The citations in an answer's text, `[id]` of an excerpt it was sent or `[n]` (its number), made links to that
 * excerpt (outside code and links). */
function cite(body, list, article) {
  const ids = new Map();
  list.forEach((x, k) => ids.has(x.id) || ids.set(x.id, k)); // an id two collections share: the first
  const walker = document.createTreeWalker(body, NodeFilter.SHOW_TEXT);
  const texts = [];
  while (walker.nextNode()) {
    if (!walker.currentNode.parentElement.closest("code, pre, a, button")) texts.push(walker.currentNode);
  }
  for (const node of texts) {
    const text = node.data;
    const found = /\[([^[\]\n]{1,300})\]/g;
    const parts = [];
    let at = 0;
    for (let hit = found.exec(text); hit; hit = found.exec(text)) {
      const n = /^[1-9][0-9]{0,2}$/.test(hit[1]) ? Number(hit[1]) - 1 : -1;
      const k = ids.has(hit[1]) ? ids.get(hit[1]) : n < list.length ? n : -1;
      if (k < 0) continue;
      const link = button(hit[0], "cite", () => showSource(article, k), `Source ${k + 1}: ${list[k].id}`);
      parts.push(text.slice(at, hit.index), link);
      at = found.lastIndex;
    }
    if (parts.length) node.replaceWith(...parts, text.slice(at));
  }
}

/** Opens the answer's excerpt `k` and brings it into view. */
function showSource(article, k) {
  const d = article.querySelectorAll(".sources .source")[k];
  if (!d) return;
  d.open = true;
  d.scrollIntoView({ block: "nearest" });
  d.querySelector("summary").focus();
}

/** The run of `m` when it is this tab's answer now streaming or running its tools. */
function runOf(m) {
  return state.running && state.running.answer === m ? state.running : null;
}

/** An answer's rounds of tool calls, each drawn once; a call's block is drawn again only when its state
 * changes (so a result opened stays open, and a focused Run button keeps the focus). */
function drawRounds(m, box, drawn) {
  const list = m.rounds || [];
  if (drawn.length > list.length) {
    drawn.length = 0;
    box.replaceChildren();
  }
  list.forEach((r, i) => {
    if (!drawn[i]) {
      const node = el("div", "round");
      if (r.reasoning) {
        const d = el("details", "reasoning");
        d.append(el("summary", null, "Reasoning"), el("div", "reasoning-text", r.reasoning));
        node.append(d);
      }
      if (r.content) {
        const said = el("div", "markdown");
        said.append(markdown(r.content));
        node.append(said);
      }
      const calls = el("div", "tool-calls");
      node.append(calls);
      box.append(node);
      drawn[i] = { calls, blocks: [] };
    }
    const d = drawn[i];
    r.tool_calls.forEach((call, k) => {
      const result = (r.results || []).find((x) => x.tool_call_id === call.id) || null;
      const status = result ? "done" : callStatus(m, call);
      const sig = `${status}|${result ? result.content.length : ""}`;
      const had = d.blocks[k];
      if (had && had.sig === sig) return;
      const node = callBlock(call, result, status);
      if (had) had.node.replaceWith(node);
      else d.calls.append(node);
      d.blocks[k] = { sig, node };
    });
  });
}

function callStatus(m, call) {
  const run = runOf(m);
  if (run) {
    if (run.asking && run.asking.id === call.id) return "ask";
    return run.calling === call.id ? "running" : "waiting";
  }
  return m.pending ? "waiting" : "not-run";
}

const CALL_STATUS = {
  writing: "…", running: "Running…", waiting: "Waiting.",
  "not-run": "Not run: the answer ended before this call.",
};

/** A tool call in an answer: the tool, its arguments as indented JSON, and its result (or Run and Deny, while
 * the page asks). */
function callBlock(call, result, status) {
  const name = call.function.name;
  const box = el("div", `tool-call ${status}`);
  box.setAttribute("role", "group");
  box.setAttribute("aria-label", `Tool call: ${name}`);
  const head = el("div", "tool-head");
  head.append(el("span", "tool-label", "Tool call"), el("code", "tool-name", name));
  const known = (state.tools || []).find((t) => t.function.name === name);
  if (known && known.source) head.append(el("span", "tool-source", known.source));
  const args = el("pre", "tool-args");
  args.append(el("code", null, transcript.pretty(call.function.arguments)));
  box.append(head, args);
  if (result) box.append(resultView(result));
  else if (status === "ask") {
    const row = el("div", "tool-status ask");
    const run = button("Run", "primary small", () => decide(call.id, true), `Run ${name}`);
    const deny = button("Deny", "small", () => decide(call.id, false), `Deny ${name}`);
    const choices = el("span", "choices");
    choices.append(run, deny);
    row.append(el("span", null, `Run ${name} with these arguments?`), choices);
    box.append(row);
  } else box.append(el("div", "tool-status", CALL_STATUS[status]));
  return box;
}

function resultView(result) {
  if (result.declined) return el("div", "tool-status declined", "Declined: the model was told the user declined.");
  const text = result.content;
  const lines = text.split("\n").length;
  const d = el("details", result.is_error ? "tool-result error" : "tool-result");
  d.open = text.length <= LONG_RESULT && lines <= 8;
  const label = result.is_error ? "Error" : "Result";
  const size = `${lines} line${lines === 1 ? "" : "s"}, ${text.length} characters`;
  d.append(el("summary", null, d.open ? label : `${label} (${size})`));
  const pre = el("pre");
  pre.append(el("code", null, text));
  d.append(pre);
  return d;
}

/** Run (`yes`) or Deny on the call the page asks about. */
function decide(id, yes) {
  const asking = state.running && state.running.asking;
  if (asking && asking.id === id) asking.answer(yes);
}

/** Whether the request that answer `m` answers sent pictures (a message on its branch has some). */
function pictured(m) {
  const conv = state.conv.messages[m.id] === m ? state.conv : null;
  return !conv || tree.path(conv, m.parent).some((x) => x.images && x.images.length);
}

/** Whether `m` answers the conversation's first message (no earlier one to branch off from). */
function firstAnswer(m) {
  const conv = state.conv.messages[m.id] === m ? state.conv : null;
  return !!conv && tree.path(conv, m.parent).filter((x) => x.role === "user").length <= 1;
}

function noteOf(m) {
  const run = runOf(m);
  if (run && run.asking) return [el("span", null, `Waiting for you: Run or Deny the call to ${run.asking.name}.`)];
  if (m.error) {
    const advice = {
      network: " Your messages are kept: press Regenerate once the server is back.",
      interrupted: " Press Regenerate to ask again.",
      size: pictured(m)
        ? " Each message sends the conversation's pictures again: start a new chat to send fewer."
        : " Each message sends the whole conversation again: start a new chat, or send less.",
      context: firstAnswer(m) && !(m.rounds && m.rounds.length) && !state.conv.system && !pictured(m)
        ? " Send a shorter message." // (what else the request carried may be what is long: a tool's result, ...)
        : " Start a new chat, or edit an earlier message to branch off with less.",
      refused: pictured(m) && /reads text only/.test(m.error.message)
        ? " A message of this conversation holds a picture, which each message sends again: edit that message to "
          + "branch off without it, or start a new chat."
        : "",
    }[m.error.kind] || "";
    const what = m.error.kind === "context" ? "Too long for the model's window: " : "";
    const said = advice && !/[.!?]$/.test(m.error.message) ? m.error.message + "." : m.error.message;
    return [el("span", null, what + said + advice)];
  }
  if (m.stopped) return [el("span", null, "Stopped.")];
  if (m.finish === "tool_steps") {
    const said = `The model was still calling tools after ${MAX_TOOL_ROUNDS} rounds: its last calls were not run.`;
    return [el("span", null, said)];
  }
  if (m.finish === "length") {
    const s = m.stats || {};
    // no max_tokens of its own: the window's end, or, where prompt and answer did not fill the window, the limit
    // serve puts on an answer (its -n)
    const short = [s.prompt, s.tokens, s.window].every(Number.isFinite) && s.prompt + s.tokens < s.window - 1;
    let limit = `the end of the model's window${s.window ? ` (${s.window} tokens)` : ""}`;
    if (s.max_tokens) limit = `max_tokens (${s.max_tokens})`;
    else if (short) limit = `the server's limit on an answer (${s.tokens} tokens: serve -n)`;
    return [el("span", null, `The answer was cut at ${limit}.`)];
  }
  return [];
}

function statsText(s) {
  const parts = [];
  // the server's count (usage), or, where it never came (an answer stopped), the pieces it streamed: an estimate
  const about = s.counted === "pieces" ? "about " : "";
  if (Number.isFinite(s.tokens)) parts.push(`${about}${s.tokens} token${s.tokens === 1 ? "" : "s"}`);
  if (Number.isFinite(s.ttft_ms)) parts.push(`${(s.ttft_ms / 1000).toFixed(2)} s to first token`);
  if (Number.isFinite(s.tps)) parts.push(`${s.tps.toFixed(1)} tokens/s`);
  if (Number.isFinite(s.rounds) && s.rounds > 1) parts.push(`${s.rounds} rounds`);
  return parts.join(" · ");
}

const toolParts = new WeakMap(); // a message's tool row → its buttons, made once and updated in place

/** A message's ‹ n/m ›, Copy, Edit and Regenerate, and an answer's stats: made once for the message on screen and
 * updated in place (never drawn again), so a focused button keeps the focus while the answer streams and ends. */
function fillTools(tools, m) {
  const busy = state.running !== null;
  let p = toolParts.get(tools);
  if (!p) {
    const whose = m.role === "user" ? "your message" : "the answer";
    const tool = (key, label, onClick, aria) => {
      const b = button(label, key === "prev" || key === "next" ? "icon small" : "small", onClick, aria);
      b.dataset.key = key;
      return b;
    };
    p = {
      nav: el("span", "versions"),
      prev: tool("prev", "‹", () => stepVersion(m, -1, "prev"), `Previous version of ${whose}`),
      count: el("span", "count"),
      next: tool("next", "›", () => stepVersion(m, 1, "next"), `Next version of ${whose}`),
      copy: tool("copy", "Copy", () => copyText(m.content, p.copy), `Copy ${whose}`),
      edit: tool("edit", "Edit", () => startEdit(m), `Edit ${whose}`),
      again: m.role === "assistant"
        ? tool("regenerate", "Regenerate", () => generate(state.conv, m.parent), "Regenerate the answer") : null,
      stats: el("span", "stats"),
    };
    p.nav.append(p.prev, p.count, p.next);
    toolParts.set(tools, p);
  }
  const versions = tree.siblings(state.conv, m.id);
  const at = versions.indexOf(m.id);
  p.count.textContent = `${at + 1}/${versions.length}`;
  switchOff(p.prev, busy || at <= 0, p.next, p.copy);
  switchOff(p.next, busy || at === versions.length - 1, p.prev, p.copy);
  switchOff(p.edit, busy, p.copy);
  if (p.again) switchOff(p.again, busy, p.copy);
  const items = [...(versions.length > 1 ? [p.nav] : []), p.copy, p.edit, ...(p.again ? [p.again] : [])];
  if (m.role === "assistant" && m.stats && !m.pending) {
    const s = m.stats;
    p.stats.textContent = statsText(s);
    const detail = [];
    if (Number.isFinite(s.prompt)) detail.push(`prompt: ${s.prompt} tokens${Number.isFinite(s.cached) ? ` (${s.cached} from the cache)` : ""}`);
    if (Number.isFinite(s.total_ms)) detail.push(`whole answer: ${(s.total_ms / 1000).toFixed(2)} s`);
    if (s.counted === "pieces") detail.push("tokens: the pieces streamed before the stop (the server's count never came)");
    p.stats.title = detail.join(" · ");
    items.push(p.stats);
  }
  // only what changed is added or taken away: a focused button is never moved (moving it would drop the focus)
  for (const child of [...tools.children]) if (!items.includes(child)) child.remove();
  items.forEach((x, k) => {
    if (tools.children[k] !== x) tools.insertBefore(x, tools.children[k] || null);
  });
}

/** Turns button `b` off (or on); a focused button turned off hands the focus to the first of `others` still on. */
function switchOff(b, off, ...others) {
  if (off && document.activeElement === b) {
    const to = others.find((o) => !o.disabled && o.isConnected);
    if (to) to.focus();
  }
  b.disabled = off;
}

/** ‹ or › under message `m`: the version before or after it is shown, the focus on the same arrow (or the other
 * one, where the end of the versions turned it off). */
function stepVersion(m, by, key) {
  const versions = tree.siblings(state.conv, m.id);
  const id = versions[versions.indexOf(m.id) + by];
  if (!id) return;
  tree.show(state.conv, id);
  persist(state.conv);
  renderConversation();
  focusTool(id, key, key === "prev" ? "next" : "prev", "copy");
}

/** Focuses the first of the buttons `keys` that is on, under message `id`; false when there is none. */
function focusTool(id, ...keys) {
  const article = articleOf(id);
  if (!article) return false;
  for (const key of keys) {
    const b = article.querySelector(`.msg-tools [data-key="${key}"]`);
    if (b && !b.disabled) {
      b.focus();
      return true;
    }
  }
  return false;
}

function articleOf(id) {
  return ui.messages.querySelector(`article[data-id="${CSS.escape(id)}"]`);
}

function startEdit(m) {
  const article = articleOf(m.id);
  if (!article) return;
  const box = el("div", "editor");
  const area = el("textarea");
  area.value = m.content;
  area.setAttribute("aria-label", m.role === "user" ? "Edit the message" : "Edit the answer");
  const save = button(m.role === "user" ? "Send" : "Save", "primary small", () => finish(true));
  const cancel = button("Cancel", "small", () => finish(false));
  const row = el("div", "row end");
  row.append(cancel, save);
  box.append(area, row);
  article.replaceChildren(article.querySelector(":scope > .who"), box); // its heading stays: the article's name
  area.focus();
  grow(area);
  area.addEventListener("input", () => grow(area));
  area.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      finish(true);
    } else if (e.key === "Escape") {
      e.stopPropagation();
      finish(false);
    }
  });
  const finish = (keep) => {
    if (!keep) {
      renderConversation();
      focusTool(m.id, "edit"); // back where the edit began
      return;
    }
    const text = area.value;
    if (m.role === "user") {
      if (state.running) return; // an answer is coming (a second click on Send): the edit is filed once
      if (!text.trim() && !(m.images && m.images.length)) return;
      const copy = tree.add(state.conv, m.parent, { role: "user", content: text, images: m.images || [] });
      generate(state.conv, copy.id);
    } else {
      const fields = { role: "assistant", content: text, reasoning: m.reasoning || "", model: m.model, edited: true };
      if (m.rounds) fields.rounds = m.rounds; // the calls it made stay with the edited answer
      if (m.sources) fields.sources = m.sources; // and the excerpts it was sent
      const version = tree.add(state.conv, m.parent, fields);
      persist(state.conv);
      renderConversation();
      focusTool(version.id, "edit");
    }
  };
}

async function copyText(text, b) {
  try {
    if (navigator.clipboard && window.isSecureContext) await navigator.clipboard.writeText(text);
    else {
      // over plain http from another machine the Clipboard API is not offered: the older way still works
      const area = el("textarea");
      area.value = text;
      area.className = "offscreen";
      document.body.append(area);
      area.select();
      document.execCommand("copy");
      area.remove();
    }
    b.textContent = "Copied";
  } catch {
    b.textContent = "Copy failed";
  }
  announce(b.textContent); // its aria-label (Copy the answer) hides its text from screen readers
  setTimeout(() => {
    b.textContent = "Copy";
  }, 1500);
}

function nearEnd() {
  const m = ui.messages;
  return m.scrollHeight - m.scrollTop - m.clientHeight < 80;
}

function scrollToEnd() {
  ui.messages.scrollTop = ui.messages.scrollHeight;
}

function schedule(m) {
  state.dirty.add(m.id);
  if (!state.frame) state.frame = requestAnimationFrame(redrawDirty);
}

function redrawDirty() {
  state.frame = 0;
  const follow = nearEnd();
  for (const id of state.dirty) {
    const redraw = state.views.get(id);
    if (redraw) redraw();
  }
  state.dirty.clear();
  if (follow) scrollToEnd();
}

// ---- sending and answers

/** A message of the conversation as the request's messages: an answer with tool rounds is its assistant
 * messages (each with its calls) and the tool messages with their results, then its last words. */
function wire(m) {
  if (m.role === "user" && m.images && m.images.length) {
    return [{
      role: "user",
      content: [{ type: "text", text: m.content }, ...m.images.map((url) => ({ type: "image_url", image_url: { url } }))],
    }];
  }
  if (m.role !== "assistant") return [{ role: m.role, content: m.content }];
  const out = roundsWire(m.rounds || []);
  if (m.content || !out.length) out.push({ role: "assistant", content: m.content });
  return out;
}

function roundsWire(rounds) {
  const out = [];
  for (const r of rounds) {
    const results = r.results || [];
    // a call never run is left out (a stopped answer's): the model is sent calls with their results only
    const answered = r.tool_calls.filter((c) => results.some((x) => x.tool_call_id === c.id));
    if (answered.length) {
      out.push({ role: "assistant", content: r.content, tool_calls: answered });
      for (const c of answered) {
        out.push({ role: "tool", tool_call_id: c.id, content: results.find((x) => x.tool_call_id === c.id).content });
      }
    } else if (r.content) out.push({ role: "assistant", content: r.content });
  }
  return out;
}

/** A focused button about to go (hidden, or turned off: a browser then drops its focus, later or at once): from
 * the keyboard, the focus goes to the message box; from a touch or a click it is let go (the box focused would pop
 * a phone's keyboard over the answer). */
function focusOnFrom(button) {
  if (document.activeElement !== button) return;
  if (button.matches(":focus-visible")) ui.input.focus();
  else button.blur();
}

function setRunning(running) {
  focusOnFrom(running ? ui.send : ui.stop); // the button pressed goes: Send while an answer comes, Stop after it
  ui.send.hidden = running;
  ui.stop.hidden = !running;
  ui.model.disabled = running;
  for (const article of ui.messages.querySelectorAll("article.msg")) {
    const m = state.conv.messages[article.dataset.id];
    const tools = article.querySelector(":scope > .msg-tools");
    if (m && tools) fillTools(tools, m);
  }
}

/** A send with no model picked: why there is none, where the models could not be listed (no API key given, the
 * server out of reach), not only that there is none. */
function noModel() {
  const why = state.modelsFailed;
  const away = !!why && why.kind === "network"; // the server out of reach: still watched for, as its own banner is
  banner(why ? `There is no model to answer yet: ${why.message}` : "There is no model to answer yet.", loadModels,
    "error", away ? "reach" : "models");
  if (away) watchReach();
}

async function send() {
  if (state.running) return;
  const text = ui.input.value;
  const images = state.attachments;
  if (!text.trim() && !images.length) return;
  if (!ui.model.value) {
    noModel();
    return;
  }
  clearBanner("notice");
  const conv = state.conv;
  if (!conv.name || conv.model !== ui.model.value) {
    if (!conv.name) conv.name = (text.trim().split("\n")[0] || "Image").slice(0, 60);
    conv.model = ui.model.value;
    conv.meta = Date.now();
  }
  const under = tree.askUnder(conv); // another tab's answer still coming on the branch: a branch beside it
  const branched = under !== conv.current;
  const message = tree.add(conv, under, { role: "user", content: text, images });
  if (branched) {
    banner("The answer at the end of this branch is unfinished (another tab is writing it, or was closed while it "
      + "did): your message went as a new branch beside its question (‹ › steps between them).", null, "info");
  }
  ui.input.value = "";
  grow(ui.input);
  state.attachments = [];
  drawAttachments();
  await generate(conv, message.id);
}

async function generate(conv, parent) {
  if (state.running) return;
  const model = ui.model.value;
  if (!model) {
    noModel();
    return;
  }
  const settings = Object.fromEntries(Object.entries(conv.settings).filter(([, v]) => v !== null && v !== undefined));
  const prior = [];
  if (conv.system.trim()) prior.push({ role: "system", content: conv.system });
  for (const m of tree.path(conv, parent)) prior.push(...wire(m));
  const tools = offeredTools(conv);
  const use = tree.toolSettings(conv);
  const { stores: documents, results } = tree.documentSettings(conv);
  const answer = tree.add(conv, parent, { role: "assistant", content: "", reasoning: "", model, pending: true });
  // the run is claimed before the first await: a second click (a double-click on Regenerate or Send) finds it taken
  const controller = new AbortController();
  const run = { controller, conv, answer, calls: [], asking: null, calling: null };
  state.running = run;
  let ended;
  try {
    await holdAnswer(answer.id, new Promise((resolve) => {
      ended = resolve;
    })); // held before it is kept unfinished: another tab never finds it so and its lock free
    await persist(conv);
  } catch (e) {
    if (ended) ended(); // not kept: nothing to hold
    state.running = null;
    throw e;
  }
  const started = performance.now();
  let first = null;
  let saved = started;
  const steps = []; // each round's {timings, usage}
  const made = new Set(); // the calls (name and arguments) this answer has made
  let mustAnswer = false; // the last round only repeated calls: the next one answers
  let gone = false;
  const keep = () => {
    answer.updated = Date.now(); // this copy of the answer is newer than any another tab holds
    persist(conv);
  };
  try {
    // what draws the run (a render, the list, the address) inside the try: a throw there ends the run, never
    // leaves the page's one run claimed for good
    dropDraft(conv.id); // its settings are kept with it now
    if (conv === state.conv) {
      // the control that asked (Regenerate, an edited message's Send) is gone with the old answer: the new one has it
      const asked = ui.messages.contains(document.activeElement);
      history.replaceState(null, "", `#${conv.id}`);
      renderConversation();
      const article = articleOf(answer.id);
      if (asked && !ui.messages.contains(document.activeElement) && article) article.focus();
    }
    refreshList();
    setRunning(true);
    if (!state.loaded.has(model) && !remoteOf(model)) {
      state.loading = model;
      showNote();
    } else if (!remoteOf(model)) {
      // said loaded when last read, but serve may have unloaded it since (keep-alive): read again, not waited for
      api.loaded().then((now) => {
        if (state.running !== run || first !== null || now.has(model)) return;
        state.loaded = now;
        state.loading = model;
        showNote();
      }).catch(() => {});
    }
    for (let step = 0; ; step++) {
      const body = { model, messages: [...prior, ...roundsWire(answer.rounds || [])], ...settings };
      // the question is searched for in the documents, and the excerpts placed in it, by the server (as run --rag)
      if (documents.length) {
        body.file_search = { vector_store_ids: documents, ...(results === null ? {} : { max_num_results: results }) };
      }
      if (tools) {
        body.tools = tools;
        body.tool_choice = mustAnswer ? "none" : step === 0 && use.mode === "required" ? "required" : "auto";
      }
      run.calls = [];
      const round = { timings: null, usage: null, pieces: 0 };
      steps.push(round);
      for await (const chunk of api.chat(body, controller.signal)) {
        if (chunk.file_search_call) answer.sources = sourcesOf(chunk.file_search_call);
        const choice = chunk.choices && chunk.choices[0];
        if (choice) {
          const delta = choice.delta || {};
          if (delta.content || delta.reasoning_content) round.pieces += 1; // a piece a token, as serve streams them
          if (typeof delta.content === "string") answer.content += delta.content;
          if (typeof delta.reasoning_content === "string") answer.reasoning += delta.reasoning_content;
          if (Array.isArray(delta.tool_calls)) takeCalls(run.calls, delta.tool_calls);
          if (first === null && (delta.content || delta.reasoning_content || delta.tool_calls)) {
            first = performance.now() - started;
            if (state.loading === model) {
              state.loading = null;
              state.loaded.add(model);
              showNote();
            }
          }
          if (choice.finish_reason) answer.finish = choice.finish_reason;
        }
        if (chunk.timings) round.timings = chunk.timings;
        if (chunk.usage) round.usage = chunk.usage;
        schedule(answer);
        if (performance.now() - saved > SAVE_EVERY_MS) {
          saved = performance.now();
          keep();
        }
      }
      const calls = run.calls.filter((c) => c && c.function.name);
      run.calls = [];
      if (!calls.length || !tools) break; // an answer without calls: the last round
      const fresh = calls.filter((c) => !made.has(callKey(c)));
      if (!fresh.length) {
        // only calls this answer has made (and the model has the results of): dropped, and the next round must
        // answer, as run and chat do (a small model asks for the same result again and again otherwise)
        if (mustAnswer) break;
        mustAnswer = true;
        answer.content = "";
        answer.reasoning = "";
        continue;
      }
      const rounds = answer.rounds || [];
      const settled = { content: answer.content, reasoning: answer.reasoning, tool_calls: fresh, results: [] };
      answer.rounds = [...rounds, settled];
      answer.content = "";
      answer.reasoning = "";
      if (rounds.length >= MAX_TOOL_ROUNDS) {
        answer.finish = "tool_steps"; // its calls stay on screen, not run
        break;
      }
      delete answer.finish;
      keep();
      schedule(answer);
      for (const call of fresh) {
        made.add(callKey(call));
        const result = await runCall(run, call, use.ask);
        const open = answer.rounds[answer.rounds.length - 1];
        open.results = [...(open.results || []), result];
        keep();
        schedule(answer);
      }
    }
  } catch (e) {
    if (e.name === "AbortError") answer.stopped = true;
    else if (state.leaving) answer.error = interrupted(); // the page cut the stream as it went: the server is fine
    else answer.error = { kind: e.kind || "refused", message: e.message || String(e) };
    if (documents.length && !answer.stopped) loadStores(); // a store removed since: Settings shows it gone
    gone = e.status === 404; // the model (or a tool) is not offered now: the picker reads the models again
  } finally {
    answer.pending = false;
    // an answer refused or stopped before a word came (a search that failed, a Stop while the model loads) has no
    // stats: `0 tokens` would say it ran
    state.running = null; // first: whatever fails below, the page can run again
    try {
      if ((answer.error || answer.stopped) && first === null) delete answer.stats;
      else answer.stats = stats(steps, first, performance.now() - started, settings.max_tokens, windowOf(model));
      conv.updated = Date.now();
      answer.updated = conv.updated;
      await persist(conv);
    } finally {
      ended(); // kept as ended (or failing to be): its lock goes
    }
    setRunning(false);
    const follow = nearEnd();
    const redraw = state.views.get(answer.id);
    if (redraw) redraw(); // at once: what is announced is what shows
    if (follow) scrollToEnd();
    if (conv === state.conv) announce(answerSaid(answer));
    if (first !== null) state.loaded.add(model);
    state.loading = null;
    showNote();
    refreshList();
    if (gone) loadModels();
  }
}

/** The excerpts a request's search sent (its file_search_call's results), as the answer keeps them. */
function sourcesOf(item) {
  const results = Array.isArray(item.results) ? item.results : [];
  return results.filter((r) => r && typeof r.file_id === "string").map((r) => {
    const store = r.attributes && typeof r.attributes.vector_store_id === "string" ? r.attributes.vector_store_id : null;
    const text = typeof r.text === "string" ? r.text : "";
    return { id: r.file_id, store, score: Number.isFinite(r.score) ? r.score : null, text };
  });
}

/** Takes a streamed delta's tool_calls into the calls of the round (OpenAI's shape: the first piece of a
 * call has its id and name, the next ones more of its arguments). */
function takeCalls(calls, pieces) {
  for (const piece of pieces) {
    const k = Number.isInteger(piece.index) ? piece.index : calls.length;
    if (k < 0 || k > 255) continue;
    if (!calls[k]) calls[k] = { id: `call_${k}`, type: "function", function: { name: "", arguments: "" } };
    const call = calls[k];
    if (typeof piece.id === "string" && piece.id) call.id = piece.id;
    const f = piece.function || {};
    if (typeof f.name === "string" && f.name) call.function.name = f.name;
    if (typeof f.arguments === "string") call.function.arguments += f.arguments;
  }
}

function callKey(call) {
  return `${call.function.name}\n${transcript.pretty(call.function.arguments)}`;
}

/** One call of the model's, run on the server once the user says Run (when the conversation asks): its result
 * (also a failure the model should read), or an ApiError that ends the answer (the server refused the call). */
async function runCall(run, call, ask) {
  const name = call.function.name;
  if (ask && !(await approval(run, call))) return { tool_call_id: call.id, content: DECLINED, declined: true };
  run.calling = call.id;
  schedule(run.answer);
  try {
    const got = await api.callTool(name, call.function.arguments, run.controller.signal);
    return { tool_call_id: call.id, content: got.content, ...(got.is_error ? { is_error: true } : {}) };
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new api.ApiError(`The server did not run ${name}: ${e.message}`, e.kind || "refused", e.status || 0);
  } finally {
    run.calling = null;
  }
}

/** Whether the user runs `call` (Run) or not (Deny); Stop or Escape ends the answer instead (an AbortError). */
function approval(run, call) {
  const signal = run.controller.signal;
  return new Promise((resolve, reject) => {
    const stopped = () => {
      run.asking = null;
      reject(new DOMException("The answer was stopped.", "AbortError"));
    };
    if (signal.aborted) {
      stopped();
      return;
    }
    signal.addEventListener("abort", stopped, { once: true });
    run.asking = {
      id: call.id,
      name: call.function.name,
      answer: (yes) => {
        signal.removeEventListener("abort", stopped);
        run.asking = null;
        const redraw = state.views.get(run.answer.id);
        if (redraw) redraw(); // at once: the buttons go with the click that answered them
        resolve(yes);
      },
    };
    schedule(run.answer);
    if (run.conv === state.conv) announce(`Waiting for you: Run or Deny the call to ${call.function.name}.`);
  });
}

/** An answer's stats over its rounds: tokens summed, the rate over all of them, the prompt the last round's. A round
 * the server did not finish (stopped) has no usage: its tokens are the pieces that came. */
function stats(steps, first, total, maxTokens, ctx) {
  const s = {};
  let tokens = null;
  let ms = 0;
  let made = 0;
  let counted = false; // a round whose count is its streamed pieces: the server's usage never came (Stop)
  for (const { timings, usage, pieces } of steps) {
    const t = timings || {};
    const u = usage || {};
    const told = Number.isFinite(u.completion_tokens) ? u.completion_tokens : t.predicted_n;
    const n = Number.isFinite(told) ? told : timings || usage ? null : pieces;
    if (Number.isFinite(n)) tokens = (tokens || 0) + n;
    if (!Number.isFinite(told) && !timings && !usage) counted = true;
    if (Number.isFinite(t.predicted_n) && Number.isFinite(t.predicted_ms)) {
      made += t.predicted_n;
      ms += t.predicted_ms;
    }
  }
  const last = steps.length ? steps[steps.length - 1] : { timings: null, usage: null };
  const t = last.timings || {};
  const u = last.usage || {};
  if (tokens !== null) s.tokens = tokens;
  if (tokens !== null && counted) s.counted = "pieces"; // an estimate: said so (statsText)
  const prompt = Number.isFinite(u.prompt_tokens) ? u.prompt_tokens : t.prompt_n;
  if (Number.isFinite(prompt)) s.prompt = prompt;
  if (Number.isFinite(t.cache_n)) s.cached = t.cache_n;
  if (steps.length > 1) {
    s.rounds = steps.length;
    if (ms > 0) s.tps = (made / ms) * 1000;
  } else if (Number.isFinite(t.predicted_per_second)) s.tps = t.predicted_per_second;
  if (first !== null) s.ttft_ms = Math.round(first);
  s.total_ms = Math.round(total);
  if (Number.isFinite(maxTokens)) s.max_tokens = maxTokens;
  if (Number.isFinite(ctx)) s.window = ctx;
  return s;
}

function stop() {
  if (state.running) state.running.controller.abort();
}

// ---- attachments

async function attach(files) {
  if (state.vision === false) { // (the button is off; a picture pasted or dropped would be refused by the server)
    banner(`${ui.model.value} takes no images: pick a model that does to send one.`, null, "info");
    return;
  }
  for (const file of files) {
    if (!file.type.startsWith("image/")) {
      banner(`${file.name} is not an image.`, null, "info");
      continue;
    }
    if (file.size > MAX_IMAGE_BYTES) {
      banner(`${file.name} is over ${MAX_IMAGE_BYTES >> 20} MB.`, null, "info");
      continue;
    }
    const url = await new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve(reader.result);
      reader.onerror = () => reject(reader.error);
      reader.readAsDataURL(file);
    });
    state.attachments.push(url);
  }
  drawAttachments();
}

// Send is for something to send: a message or a picture (an empty one did nothing, with nothing saying why)
function sendable() {
  const off = !ui.input.value.trim() && !state.attachments.length;
  if (off) focusOnFrom(ui.send); // Send pressed from the keyboard: the box it emptied has the focus, as setRunning's
  ui.send.disabled = off;
  ui.send.title = ui.send.disabled ? "Type a message (or attach an image) first" : "";
}

function drawAttachments() {
  sendable();
  ui.attachments.replaceChildren(...state.attachments.map((url, k) => {
    const chip = el("div", "chip");
    const img = el("img");
    img.src = url;
    img.alt = `image ${k + 1}`;
    chip.append(img, button("✕", "icon small", () => {
      state.attachments.splice(k, 1);
      drawAttachments();
    }, `Remove image ${k + 1}`));
    return chip;
  }));
}

// ---- settings of the conversation on screen

function openSettings() {
  const c = state.conv;
  $("conv-name").value = c.name;
  $("system").value = c.system;
  for (const k of tree.SETTINGS) $(k).value = c.settings[k] === null ? "" : String(c.settings[k]);
  $("settings-error").hidden = true;
  drawToolSettings(c);
  drawDocumentSettings(c);
  const { results } = tree.documentSettings(c);
  $("max_num_results").value = results === null ? "" : String(results);
  const saved = hasMessages(c);
  for (const id of ["export-json", "export-md", "delete-conv"]) $(id).disabled = !saved;
  state.settingsFrom = settingsForm();
  ui.settings.showModal();
  refreshStores(c);
}

/** The server's stores read again as Settings opens: where they changed (a collection removed since the page
 * loaded), the Documents part is drawn again, its boxes as they are now (one checked that is gone shown so). */
async function refreshStores(c) {
  const seen = () => JSON.stringify([(state.stores || []).map((s) => s.id), state.storesError]);
  const before = seen();
  await loadStores();
  if (seen() === before || !ui.settings.open || state.conv !== c) return;
  const boxes = [...$("document-list").querySelectorAll("input[type=checkbox]")];
  drawDocumentSettings(c, boxes.filter((b) => b.checked).map((b) => b.value));
}

/** The Tools part of the settings: shown when the server offers tools (or could not list them). */
function drawToolSettings(c) {
  const tools = state.tools || [];
  $("tools-settings").hidden = !tools.length && !state.toolsError;
  const use = tree.toolSettings(c);
  $("tool-mode").value = use.mode;
  $("tool-ask").checked = use.ask;
  $("tools-error").textContent = state.toolsError ? `The server's tools could not be listed: ${state.toolsError}` : "";
  $("tools-error").hidden = !state.toolsError;
  $("tool-mode").disabled = !tools.length;
  $("tool-ask").disabled = !tools.length;
  $("tool-list").replaceChildren(...tools.map((t) => {
    const li = el("li");
    li.append(el("code", "tool-name", t.function.name));
    if (t.source) li.append(el("span", "tool-source", t.source));
    if (t.function.description) li.append(el("div", "hint", t.function.description));
    return li;
  }));
}

/** The Documents part of the settings: shown when the server offers vector stores (or could not list them, or
 * the conversation names one): a box to check for each, none checked by default. */
function drawDocumentSettings(c, chosen = tree.documentSettings(c).stores) {
  const offered = state.stores || [];
  const gone = chosen.filter((id) => !offered.some((s) => s.id === id));
  $("documents-settings").hidden = !offered.length && !gone.length && !state.storesError;
  $("documents-error").textContent = state.storesError ? `The server's documents could not be listed: ${state.storesError}` : "";
  $("documents-error").hidden = !state.storesError;
  const item = (id, hint) => {
    const li = el("li");
    const label = el("label", "check");
    const box = el("input");
    box.type = "checkbox";
    box.value = id;
    box.checked = chosen.includes(id);
    label.append(box, el("code", "store-name", id));
    li.append(label);
    if (hint) li.append(el("div", "hint", hint));
    return li;
  };
  $("document-list").replaceChildren(
    ...offered.map((s) => {
      const n = s.file_counts && Number.isFinite(s.file_counts.total) ? s.file_counts.total : null;
      const model = s.metadata && s.metadata.model ? `embedded by ${s.metadata.model}` : "";
      return item(s.id, [n === null ? "" : `${n} text${n === 1 ? "" : "s"}`, model].filter(Boolean).join(" · "));
    }),
    ...gone.map((id) => item(id, "not offered by the server now (removed since, or never here): uncheck it, "
      + "or every question sent with it is refused")),
  );
}

/** What the settings dialog shows, field by field, as text: what it opened with is compared to what it saves. */
function settingsForm() {
  const form = { name: $("conv-name").value, system: $("system").value };
  for (const k of tree.SETTINGS) form[k] = $(k).value;
  form.tools = `${$("tool-mode").value} ${$("tool-ask").checked}`;
  const boxes = [...$("document-list").querySelectorAll("input[type=checkbox]")];
  form.documents = JSON.stringify([boxes.filter((b) => b.checked).map((b) => b.value).sort(),
    $("max_num_results").value.trim()]);
  return form;
}

function saveSettings(e) {
  e.preventDefault();
  const c = state.conv;
  // only the fields changed in the dialog are written: another tab's change made since it opened (a rename) stays
  const from = state.settingsFrom || {};
  const now = settingsForm();
  const changed = (k) => now[k] !== from[k];
  const values = {};
  for (const k of tree.SETTINGS) {
    const input = $(k);
    if (input.value.trim() === "") {
      values[k] = null;
      continue;
    }
    const n = Number(input.value);
    const integer = ["top_k", "max_tokens", "seed"].includes(k);
    if (!input.checkValidity() || !Number.isFinite(n) || (integer && !Number.isInteger(n))) {
      const error = $("settings-error");
      error.textContent = `${k}: ${input.validationMessage || "not a number"}`;
      error.hidden = false;
      input.focus();
      return;
    }
    values[k] = n;
  }
  let results = null;
  if (!$("documents-settings").hidden && $("max_num_results").value.trim() !== "") {
    const input = $("max_num_results");
    const n = Number(input.value);
    if (!input.checkValidity() || !Number.isInteger(n)) {
      const error = $("settings-error");
      error.textContent = `max_num_results: ${input.validationMessage || "not a whole number"}`;
      error.hidden = false;
      input.focus();
      return;
    }
    results = n;
  }
  ui.settings.close();
  if (!Object.keys(now).some(changed)) return;
  const settings = { ...c.settings };
  for (const k of tree.SETTINGS) if (changed(k)) settings[k] = values[k];
  c.settings = settings;
  if (state.tools && state.tools.length && changed("tools")) {
    c.tools = { mode: $("tool-mode").value, ask: $("tool-ask").checked };
  }
  if (!$("documents-settings").hidden && changed("documents")) {
    const boxes = [...$("document-list").querySelectorAll("input[type=checkbox]")];
    const stores = boxes.filter((b) => b.checked).map((b) => b.value);
    c.documents = results === null ? { stores } : { stores, results }; // none: the server's default
  }
  if (changed("system")) c.system = $("system").value;
  if (changed("name")) c.name = $("conv-name").value.trim().slice(0, 200);
  c.meta = Date.now();
  if (hasMessages(c)) {
    persist(c).then(refreshList);
  } else {
    keepDraft(c);
  }
}

// ---- wiring

function grow(area) {
  area.style.height = "auto";
  area.style.height = `${Math.min(area.scrollHeight, 240)}px`;
}

function openSidebar() {
  ui.app.classList.add("sidebar-open");
  $("scrim").hidden = false;
  $("open-sidebar").setAttribute("aria-expanded", "true");
  // the page under the drawer is out of reach (Tab, a screen reader) until it closes
  document.querySelector("main").inert = true;
  $("new-chat").focus();
}

function sidebarOpen() {
  // a drawer only on a narrow screen, where ☰ shows
  return ui.app.classList.contains("sidebar-open") && $("open-sidebar").offsetParent !== null;
}

function closeSidebar() {
  const had = sidebarOpen() && ui.app.querySelector("#sidebar").contains(document.activeElement);
  ui.app.classList.remove("sidebar-open");
  $("scrim").hidden = true;
  $("open-sidebar").setAttribute("aria-expanded", "false");
  document.querySelector("main").inert = false;
  if (had) $("open-sidebar").focus(); // the focus does not stay in a list no one sees
}

/** Tab in the open drawer goes round its controls: past the last, the first again (Shift+Tab: the other way). */
function tabInDrawer(e) {
  if (e.key !== "Tab" || !sidebarOpen() || document.querySelector("dialog[open]")) return;
  const controls = [...$("sidebar").querySelectorAll("button, input:not([type=file])")]
    .filter((c) => !c.disabled && c.getClientRects().length);
  if (!controls.length) return;
  const first = controls[0];
  const last = controls[controls.length - 1];
  const inside = $("sidebar").contains(document.activeElement);
  if (e.shiftKey && (document.activeElement === first || !inside)) {
    e.preventDefault();
    last.focus();
  } else if (!e.shiftKey && (document.activeElement === last || !inside)) {
    e.preventDefault();
    first.focus();
  }
}

/** Every conversation saved as JSON: one file, or, past what Import JSON reads, several files that each fit it. */
async function exportAll() {
  const bytes = (text) => new Blob([text]).size;
  const empty = bytes(transcript.exportJson([]));
  const parts = []; // [{conversations, size}]: what each file holds and its size in bytes
  const over = []; // conversations over the bound on their own: saved, but Import JSON cannot read them back
  for (const c of await store.all()) {
    const size = bytes(transcript.exportJson([c])) - empty; // with its indent: as it is in any file of the list
    if (empty + size > MAX_IMPORT_BYTES) over.push(c);
    const last = parts[parts.length - 1];
    if (last && last.size + 2 + size <= MAX_IMPORT_BYTES) { // ",\n" between two conversations
      last.conversations.push(c);
      last.size += 2 + size;
    } else {
      parts.push({ conversations: [c], size: empty + size });
    }
  }
  parts.forEach((part, k) => {
    const name = parts.length === 1 ? "localgen-chats.json" : `localgen-chats-${k + 1}-of-${parts.length}.json`;
    transcript.download(name, transcript.exportJson(part.conversations), "application/json");
  });
  const bound = `${MAX_IMPORT_BYTES >> 20} MB`;
  if (over.length) {
    const names = over.map((c) => `“${c.name || "Untitled"}”`).join(", ");
    banner(`Saved, but ${names} ${over.length === 1 ? "is" : "are"} over the ${bound} Import JSON reads on `
      + `${over.length === 1 ? "its" : "their"} own: ${over.length === 1 ? "that file" : "those files"} cannot be `
      + "imported back.", null, "error");
  } else if (parts.length > 1) {
    banner(`Saved as ${parts.length} files, each within the ${bound} Import JSON reads.`, null, "info");
  }
}

async function importFile(file) {
  if (file.size > MAX_IMPORT_BYTES) { // refused before it is read: the whole text would be held, then parsed
    const mb = (file.size / (1 << 20)).toFixed(1);
    banner(`${file.name} cannot be imported: it is ${mb} MB, over the ${MAX_IMPORT_BYTES >> 20} MB an import may be.`);
    return;
  }
  let conversations;
  try {
    conversations = transcript.importJson(await file.text());
  } catch (e) {
    banner(`${file.name} cannot be imported: ${e.message}`, null);
    return;
  }
  let kept = 0;
  for (const c of conversations) kept += (await persist(c)) ? 1 : 0;
  show(conversations[0]);
  // one the browser would not keep: its banner stays (shown, the conversation is not kept until a change is)
  if (kept === conversations.length) {
    banner(`Imported ${kept} conversation${kept === 1 ? "" : "s"}.`, null, "info");
  }
}

function wireEvents() {
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    send();
  });
  ui.input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    }
  });
  ui.input.addEventListener("input", () => {
    grow(ui.input);
    sendable();
  });
  ui.input.addEventListener("paste", (e) => {
    const files = [...(e.clipboardData ? e.clipboardData.files : [])].filter((f) => f.type.startsWith("image/"));
    if (files.length) {
      e.preventDefault();
      attach(files);
    }
  });
  ui.stop.addEventListener("click", stop);
  document.addEventListener("keydown", (e) => {
    if (e.key !== "Escape" || document.querySelector("dialog[open]")) return;
    if (sidebarOpen()) {
      e.preventDefault();
      closeSidebar(); // the drawer first: a second Escape stops the answer
    } else if (state.running) {
      e.preventDefault();
      stop();
    }
  });
  ui.model.addEventListener("change", () => modelChanged(true));
  ui.attach.addEventListener("click", () => ui.attachFile.click());
  ui.attachFile.addEventListener("change", () => {
    attach([...ui.attachFile.files]);
    ui.attachFile.value = "";
  });
  ui.messages.addEventListener("click", (e) => {
    const b = e.target.closest("button.copy");
    if (b) copyText(b.closest(".code").querySelector("code").textContent, b);
  });
  ui.bannerRetry.addEventListener("click", () => {
    const again = retry;
    clearBanner();
    if (again) again();
  });
  $("new-chat").addEventListener("click", newChat);
  $("open-sidebar").addEventListener("click", openSidebar);
  document.addEventListener("keydown", tabInDrawer);
  // widened past a phone's width with the drawer open: the list is beside the chat again, and the chat in reach
  matchMedia("(max-width: 760px)").addEventListener("change", (e) => {
    if (!e.matches) closeSidebar();
  });
  $("close-sidebar").addEventListener("click", closeSidebar);
  $("scrim").addEventListener("click", closeSidebar);
  $("open-settings").addEventListener("click", openSettings);
  $("settings-form").addEventListener("submit", saveSettings);
  $("settings-cancel").addEventListener("click", () => ui.settings.close());
  $("export-json").addEventListener("click", () => transcript.download(
    transcript.fileName(state.conv, "json"), transcript.exportJson([state.conv]), "application/json"));
  $("export-md").addEventListener("click", () => transcript.download(
    transcript.fileName(state.conv, "md"), transcript.exportMarkdown(state.conv), "text/markdown"));
  $("delete-conv").addEventListener("click", () => {
    ui.settings.close();
    deleteConversation(state.conv);
  });
  $("export-all").addEventListener("click", exportAll);
  $("import").addEventListener("click", () => $("import-file").click());
  $("import-file").addEventListener("change", () => {
    const file = $("import-file").files[0];
    $("import-file").value = "";
    if (file) importFile(file);
  });
  window.addEventListener("hashchange", () => { // another conversation's address typed or opened in this tab
    const id = addressedId();
    if (id && id !== state.conv.id) openConversation(id);
  });
  // a page closed or reloaded cuts its answer's stream, whose read then fails as a lost connection's would
  window.addEventListener("pagehide", () => {
    state.leaving = true;
  });
  window.addEventListener("pageshow", () => {
    state.leaving = false; // back from the back-forward cache
  });
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible" && !state.running) loadModels();
  });
}

/** The conversation the address names (after #): a conversation's id, or what was typed there (a cut or mistyped
 * %-escape too: then no conversation has it, and the page says so). */
function addressedId() {
  const raw = location.hash.slice(1);
  try {
    return decodeURIComponent(raw);
  } catch {
    return raw;
  }
}

async function start() {
  api.onKeyNeeded(askKey);
  api.onReached(() => clearBanner("reach"));
  store.onChange(heard);
  listenForAsks();
  wireEvents();
  sendable();
  const id = addressedId();
  try {
    await store.recover(tree.merge, tree.damage); // what a reload cut short, before anything is listed or shown
  } catch (e) {
    banner(`This browser would not keep the conversation: ${e.message || e}`, null, "error", "write");
  }
  await refreshList();
  if (id) await openConversation(id);
  else {
    state.conv = draftConversation() || state.conv; // a new conversation's settings, chosen before a reload
    renderConversation();
  }
  await loadModels();
  // the models can take a while: a focus the user has moved meanwhile stays where it is
  if (document.activeElement === document.body || !document.activeElement) ui.input.focus();
}

start();
