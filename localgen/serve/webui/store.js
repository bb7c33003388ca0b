// Conversations kept in this browser (IndexedDB, one record per conversation, for this page's origin): nothing
// of them is sent anywhere but in the chat requests themselves.

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
    tx.onerror = () => reject(tx.error);
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

export function put(conv) {
  return run("readwrite", (s) => s.put(conv));
}

export function remove(id) {
  return run("readwrite", (s) => s.delete(id));
}
