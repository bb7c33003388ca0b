// Conversations kept in this browser (IndexedDB, one record per conversation, for this page's origin): nothing
// of them is sent anywhere but in the chat requests themselves. Several tabs may write one conversation: each
// write takes in what another tab added first (save), and every tab hears of the others' writes (onChange).

const NAME = "localgen-chat";
const STORE = "conversations";
let opened = null;

function database() {
  if (opened === null) {
    opened = new Promise((resolve, reject) => {
      const request = indexedDB.open(NAME, 1);
      request.onupgradeneeded = () => request.result.createObjectStore(STORE, { keyPath: "id" });
      request.onsuccess = () => resolve(request.result);
      request.onerror = () => reject(request.error);
    });
  }
  return opened;
}

async function run(mode, work) {
  const db = await database();
  return new Promise((resolve, reject) => {
    const tx = db.transaction(STORE, mode);
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

export function get(id) {
  return run("readonly", (s) => s.get(id));
}

/** Writes `conv`, first taking into it (through `merge(conv, stored)`, in the same transaction, so that no other
 * tab writes in between) what the copy kept here has that it lacks: another tab may have added to it. True
 * when `conv` took something. Other tabs of this page hear of the change. */
export async function save(conv, merge) {
  const noted = journal(conv);
  const db = await database();
  const took = await new Promise((resolve, reject) => {
    const tx = db.transaction(STORE, "readwrite");
    const s = tx.objectStore(STORE);
    let took = false;
    const got = s.get(conv.id);
    got.onsuccess = () => {
      if (got.result) took = merge(conv, got.result);
      s.put(conv);
    };
    tx.oncomplete = () => {
      if (noted !== null && localStorage.getItem(PENDING + conv.id) === noted) forget(conv.id); // a later note stays
      resolve(took);
    };
    tx.onerror = () => reject(tx.error || new Error("the browser's storage refused the change"));
    tx.onabort = () => reject(tx.error || new Error("the browser's storage refused the change"));
  });
  tell({ kind: "saved", id: conv.id });
  return took;
}

export async function remove(id) {
  forget(id);
  await run("readwrite", (s) => s.delete(id));
  tell({ kind: "removed", id });
}

// IndexedDB commits a write some milliseconds after the screen shows it, and a reload (or a closed tab) in
// between loses it. So each write is noted first in localStorage, which writes at once, and the note goes when
// the write has committed; the next load writes what such a note still holds (recover). A note that does not
// fit (localStorage is small) is not kept: the write goes on as before.
const PENDING = "localgen-chat-pending:";

function journal(conv) {
  try {
    const text = JSON.stringify(conv);
    localStorage.setItem(PENDING + conv.id, text);
    return text;
  } catch {
    forget(conv.id); // an older note must not come back over this write
    return null;
  }
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
    } catch {
      conv = null;
    }
    if (conv && typeof conv.id === "string" && !damage(conv)) await save(conv, merge);
    else forget(key.slice(PENDING.length));
  }
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
