// The server's API as any client calls it (no private route): the models (/v1/models, llama-server's /models
// for what is loaded, Ollama's /api/show for what a model takes), the chat stream (/v1/chat/completions with
// server-sent events), the server's tools (/tools, /tools/call: its --mcp and --functions), its documents
// (/v1/vector_stores: serve --collection; searched by the chat request's file_search field), the API key
// (asked for once on a 401 and kept in sessionStorage), and every failure as
// an ApiError whose `kind` says what went wrong: "network" (the server is gone), "auth", "context" (the
// conversation does not fit the model's window), "size" (the request is over serve's --max-body) or "refused"
// (any other answer that is not a success).

const KEY = "localgen.apiKey";

export class ApiError extends Error {
  constructor(message, kind, status = 0) {
    super(message);
    this.name = "ApiError";
    this.kind = kind;
    this.status = status;
  }
}

let askKey = null; // set by the page: async (reason) => the key typed, or null when the user declines
let asking = null; // one question at a time, whatever number of calls met the 401

export function onKeyNeeded(ask) {
  askKey = ask;
}

let reached = null; // set by the page: called whenever the server answers a call, whatever it answers

export function onReached(heard) {
  reached = heard;
}

export function hasKey() {
  return sessionStorage.getItem(KEY) !== null;
}

function keyFor(reason) {
  if (asking === null) {
    asking = askKey(reason).finally(() => {
      asking = null;
    });
  }
  return asking;
}

async function call(path, init = {}) {
  for (;;) {
    const headers = new Headers(init.headers || {});
    const key = sessionStorage.getItem(KEY);
    if (key !== null) {
      try {
        headers.set("Authorization", `Bearer ${key}`);
      } catch {
        sessionStorage.removeItem(KEY); // a key no browser can send (kept by an older page): asked for again
        continue;
      }
    }
    let response;
    try {
      response = await fetch(path, { ...init, headers, cache: "no-store" });
    } catch (e) {
      if (e.name === "AbortError") throw e;
      throw new ApiError("Cannot reach the server: is localgen serve still running?", "network");
    }
    if (reached !== null) reached();
    if (response.status === 401 && askKey !== null) {
      if (sessionStorage.getItem(KEY) !== key) continue; // another call was given the key meanwhile
      const typed = await keyFor(key === null ? "This server needs its API key." : "The server refused that key.");
      if (typed) {
        sessionStorage.setItem(KEY, typed);
        continue;
      }
      throw new ApiError("No API key: the server answers only with its key.", "auth", 401);
    }
    if (!response.ok) throw await errorOf(response);
    return response;
  }
}

async function errorOf(response) {
  let message = "";
  try {
    const doc = await response.json();
    const e = doc.error;
    message = typeof e === "string" ? e : (e && typeof e.message === "string" ? e.message : "");
  } catch {
    // not JSON: the status says enough
  }
  const status = response.status;
  message = message || response.statusText || "no reason given";
  if (status === 401) return new ApiError(`The server refused the key: ${message}`, "auth", status);
  if (/context window|slot's window/.test(message)) return new ApiError(message, "context", status);
  // any other 413 is the body over serve's --max-body (pictures, mostly), not the model's window
  if (status === 413) return new ApiError(`${message} (HTTP ${status})`, "size", status);
  return new ApiError(`${message} (HTTP ${status})`, "refused", status);
}

async function json(path, init) {
  return (await call(path, init)).json();
}

/** Every model the server offers: [{id, max_model_len, default}], the served ones first. */
export async function models() {
  return (await json("v1/models")).data;
}

/** The names of the models loaded now (llama-server's router list). */
export async function loaded() {
  const doc = await json("models");
  return new Set(doc.data.filter((m) => m.status && m.status.value === "loaded").map((m) => m.id));
}

/** What a model takes ("vision", "thinking", ...), from its GGUF header: nothing is loaded; and "chat" where it
 * has a chat template (a base model has none: the server refuses its chats). */
export async function capabilities(model) {
  const doc = await json("api/show", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ model }),
  });
  const caps = Array.isArray(doc.capabilities) ? doc.capabilities : [];
  return typeof doc.template === "string" && doc.template.trim() ? [...caps, "chat"] : caps;
}

/** The tools the server offers (serve's --mcp and --functions): [{type, function: {name, description,
 * parameters}, source}], [] when it has none. A server older than the route (404) offers none. */
export async function tools() {
  let doc;
  try {
    doc = await json("tools");
  } catch (e) {
    if (e.status === 404) return [];
    throw e;
  }
  return Array.isArray(doc.data) ? doc.data.filter((t) => t && t.function && typeof t.function.name === "string") : [];
}

/** The vector stores the server offers (serve --collection: embeddings collections), [{id, name, file_counts,
 * metadata}], [] with none. A server older than the route (404) offers none. */
export async function vectorStores() {
  let doc;
  try {
    doc = await json("v1/vector_stores");
  } catch (e) {
    if (e.status === 404) return [];
    throw e;
  }
  return Array.isArray(doc.data) ? doc.data.filter((s) => s && typeof s.id === "string") : [];
}

/** Runs one of the server's tools: {content, is_error}. A call that failed (the tool raised, timed out, its
 * arguments did not fit) is a result with is_error; a call the server refuses (no such tool, no key, the server
 * gone) is an ApiError. `args`: the arguments as the model wrote them (a JSON string). */
export async function callTool(name, args, signal) {
  const doc = await json("tools/call", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ name, arguments: args }),
    signal,
  });
  const content = typeof doc.content === "string" ? doc.content : JSON.stringify(doc.content);
  return { content, is_error: doc.is_error === true };
}

/** The chunks of a streamed chat completion, as parsed JSON objects, until `data: [DONE]`. An event that is not a
 * JSON object (an upstream's, passed on by serve --endpoint) is skipped, so that the server's error event after it
 * is what the answer says; when none comes, the answer says that part of it could not be read. */
export async function* chat(body, signal) {
  const response = await call("v1/chat/completions", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
    signal,
  });
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let cr = "";
  let unreadable = 0; // events skipped: not a JSON object
  const lost = () => new ApiError(`The server sent ${unreadable === 1 ? "a part" : `${unreadable} parts`} of the `
    + "answer that could not be read (not JSON): what is shown may lack words.", "refused");
  for (;;) {
    let part;
    try {
      part = await reader.read();
    } catch (e) {
      if (signal.aborted) throw e;
      throw new ApiError("The connection to the server was lost in the middle of the answer.", "network");
    }
    if (part.done) break;
    // line ends as the server-sent events spec takes them (CRLF, CR or LF: an upstream behind serve --endpoint
    // passes its own through), and an event's data lines joined with newlines before it is read as JSON
    // (a CR that ends what came is held: an LF may come next, the two one line end)
    const text = cr + decoder.decode(part.value, { stream: true });
    cr = text.endsWith("\r") ? "\r" : "";
    buffer += (cr ? text.slice(0, -1) : text).replace(/\r\n?/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const lines = event.split("\n").filter((line) => line.startsWith("data:"));
      if (!lines.length) continue;
      const data = lines.map((line) => line.slice(line.startsWith("data: ") ? 6 : 5)).join("\n").trim();
      if (data === "[DONE]") {
        if (unreadable) throw lost();
        return;
      }
      let doc;
      try {
        doc = JSON.parse(data);
      } catch {
        doc = null;
      }
      if (!doc || typeof doc !== "object" || Array.isArray(doc)) {
        unreadable += 1;
        continue;
      }
      if (doc.error) {
        const e = doc.error;
        const message = typeof e === "string" ? e : e.message || "the server stopped the answer";
        // a server that stops mid-answer is one going away: its advice is the lost connection's (Regenerate)
        const kind = /context window|slot's window/.test(message) ? "context"
          : /shutting down/.test(message) ? "network" : "refused";
        throw new ApiError(message, kind, typeof e.code === "number" ? e.code : 0);
      }
      yield doc;
    }
  }
  if (unreadable) throw lost();
  throw new ApiError("The answer ended before the server finished it.", "network");
}
