// Conversations kept in this browser (IndexedDB, one record per conversation, for this page's origin): nothing
// of them is sent anywhere but in the chat requests themselves. Several tabs may write one conversation: each
// write takes in what another tab added first (save), and every tab hears of the others' writes (onChange).

const NAME = "localgen-chat";
const STORE = "conversations";
let opened = null;

// The connection is opened at the first use and kept; the browser may close it (the site's data cleared while the
// page is open, another version opened): it is dropped then, and the next use opens the database again.
function database() {
  if (opened === null) {
    const opening = new Promise((resolve, reject) => {
      const request = indexedDB.open(NAME, 1);
      request.onupgradeneeded = () => request.result.createObjectStore(STORE, { keyPath: "id" });
      request.onsuccess = () => {
        const db = request.result;
        db.onclose = () => drop(opening);
        db.onversionchange = () => {
          db.close(); // the database is being deleted or upgraded: this connection must not hold it up
          drop(opening);
        };
        resolve(db);
      };
      request.onerror = () => {
        drop(opening); // the next use asks again
        reject(request.error);
      };
    });
    opened = opening;
  }
  return opened;
}

function drop(connection) {
  if (opened !== connection) return;
  opened = null;
  committed.clear(); // the records may be gone with it: the next note of a conversation is whole
}

/** A transaction on the kept conversations; a connection the browser has closed is opened again once. */
async function transaction(mode) {
  const connection = database();
  const db = await connection;
  try {
    return db.transaction(STORE, mode);
  } catch (e) {
    if (e.name !== "InvalidStateError") throw e;
    drop(connection);
    return (await database()).transaction(STORE, mode);
  }
}

async function run(mode, work) {
  const tx = await transaction(mode);
  return new Promise((resolve, reject) => {
    const request = work(tx.objectStore(STORE));
    tx.oncomplete = () => resolve(request ? request.result : undefined);
    tx.onerror = () => reject(tx.error || new Error("the browser's storage refused the change"));
    tx.onabort = () => reject(tx.error || new Error("the browser's storage refused the change"));
  });
}

/** Every conversation kept here, the most recently changed first. */
export async function all() {
  const list = await run("readonly", (s) => s.getAll());
  return list.sort((a, b) => b.updated - a.updated);
}

/** The conversation `id` as kept here (undefined: none); a later write of it is noted as its changes since. */
export async function get(id) {
  const conv = await run("readonly", (s) => s.get(id));
  if (conv && conv.messages && typeof conv.messages === "object") remember(id, pieces(conv));
  return conv;
}

/** Writes `conv`, first taking into it (through `merge(conv, stored)`, in the same transaction, so that no other
 * tab writes in between) what the copy kept here has that it lacks: another tab may have added to it. True
 * when `conv` took something. Other tabs of this page hear of the change. */
export async function save(conv, merge) {
  const noted = journal(conv);
  let tx;
  try {
    tx = await transaction("readwrite");
  } catch (e) {
    unguard(noted);
    throw e;
  }
  let wrote = null;
  const took = await new Promise((resolve, reject) => {
    const s = tx.objectStore(STORE);
    let took = false;
    const got = s.get(conv.id);
    got.onsuccess = () => {
      if (got.result) took = merge(conv, got.result);
      s.put(conv); // the record is this copy as it is now: what a later note is measured against
      wrote = pieces(conv);
    };
    tx.oncomplete = () => {
      remember(conv.id, wrote);
      if (noted !== null && localStorage.getItem(PENDING + conv.id) === noted) forget(conv.id); // a later note stays
      unguard(noted);
      resolve(took);
    };
    const failed = () => {
      unguard(noted);
      reject(tx.error || new Error("the browser's storage refused the change"));
    };
    tx.onerror = failed;
    tx.onabort = failed;
  });
  tell({ kind: "saved", id: conv.id });
  return took;
}

export async function remove(id) {
  forget(id);
  committed.delete(id);
  await run("readwrite", (s) => s.delete(id));
  tell({ kind: "removed", id });
}

// IndexedDB commits a write some milliseconds after the screen shows it, and a reload (or a closed tab) in
// between loses it. So each write is noted first in localStorage, which writes at once, and the note goes when
// the write has committed; the next load writes what such a note still holds (recover). localStorage is small
// (its quota, a few MB, is shared by every note), so a note holds only the messages that changed since this tab's
// last write of the conversation committed, with its settings: the record kept holds the rest. A note that still
// does not fit (one message larger than the room left: pictures, mostly) is not kept; until that write commits,
// the browser asks before the page is closed or reloaded.
const PENDING = "localgen-chat-pending:";
const committed = new Map(); // conversation id → {message id: its JSON} as this tab's last committed write held it
const REMEMBERED = 8; // conversations whose committed copy is remembered, the latest used (another's note is whole)
let unnoted = 0; // writes under way that no note covers

function remember(id, messages) {
  committed.delete(id); // set again: the latest used last
  committed.set(id, messages);
  if (committed.size > REMEMBERED) committed.delete(committed.keys().next().value);
}

function pieces(conv) {
  return Object.fromEntries(Object.entries(conv.messages).map(([id, m]) => [id, JSON.stringify(m)]));
}

/** The note of a write of `conv` (its text, or null when it did not fit). */
function journal(conv) {
  const before = committed.get(conv.id);
  const { messages, ...rest } = conv;
  const changed = {};
  for (const [id, m] of Object.entries(messages)) {
    const text = JSON.stringify(m);
    if (!before || before[id] !== text) changed[id] = m;
  }
  // `upon`: the note names only what changed since the record held the rest (a note without it is whole)
  const note = before ? { ...rest, upon: true, messages: changed } : conv;
  try {
    const text = JSON.stringify(note);
    localStorage.setItem(PENDING + conv.id, text);
    return text;
  } catch {
    forget(conv.id); // an older note must not come back over this write
    guard();
    return null;
  }
}

function leaving(e) {
  e.preventDefault();
  e.returnValue = ""; // the browser asks whether to leave: the change is not kept yet
}

function guard() {
  if (unnoted++ === 0) window.addEventListener("beforeunload", leaving);
}

function unguard(noted) {
  if (noted === null && --unnoted === 0) window.removeEventListener("beforeunload", leaving);
}

function forget(id) {
  try {
    localStorage.removeItem(PENDING + id);
  } catch {
    // storage turned off: nothing was noted
  }
}

/** Writes the conversations whose last write a reload or a closed tab cut short (their notes), merged (through
 * `merge`) with what the browser's storage holds of them. A note that is not a conversation (`damage(conv)` says
 * why: set by hand, or cut) is dropped: what IndexedDB holds of that conversation stays. */
export async function recover(merge, damage) {
  let keys = [];
  try {
    keys = Object.keys(localStorage).filter((k) => k.startsWith(PENDING));
  } catch {
    return;
  }
  for (const key of keys) {
    let conv = null;
    try {
      conv = JSON.parse(localStorage.getItem(key));
      if (conv && conv.upon === true) conv = await upon(conv, merge, damage);
    } catch {
      conv = null;
    }
    if (conv && typeof conv.id === "string" && !damage(conv)) await save(conv, merge);
    else forget(key.slice(PENDING.length));
  }
}

/** The conversation a note of its changes makes of the record kept, merged (through `merge`) with what that record
 * has that the note lacks (another tab's messages); null: no record, not a note, or one that makes a conversation
 * `damage` refuses (checked before the merge, which walks its branches). */
async function upon(note, merge, damage) {
  if (typeof note.id !== "string" || !note.messages || typeof note.messages !== "object") return null;
  const stored = await run("readonly", (s) => s.get(note.id));
  if (!stored || !stored.messages || typeof stored.messages !== "object") return null;
  const { upon: _, ...rest } = note;
  const conv = { ...rest, messages: { ...stored.messages, ...note.messages } };
  if (damage(conv)) return null;
  merge(conv, stored);
  return conv;
}

// Every tab of this page (same origin) hears what the others wrote or deleted, to show it.
const channel = typeof BroadcastChannel === "function" ? new BroadcastChannel(NAME) : null;

function tell(news) {
  if (channel) channel.postMessage(news);
}

/** `listen({kind: "saved"|"removed", id})` is called when another tab changed a conversation. */
export function onChange(listen) {
  if (channel) channel.onmessage = (e) => listen(e.data);
}
