// The dashboard's HTTP API (see docs/ui.md). The token travels in the HttpOnly cookie the
// server set when the printed address was opened, so nothing here handles it.

export class ApiError extends Error {
  constructor(status, code, reason) {
    super(reason || code || `HTTP ${status}`);
    this.status = status;
    this.code = code;
    this.reason = reason || `the dashboard answered HTTP ${status}`;
  }
}

let onUnauthorised = () => {};

/** Called once when the server says the session has no valid token (HTTP 401). */
export function whenUnauthorised(fn) {
  onUnauthorised = fn;
}

async function call(method, path, body) {
  const init = { method, headers: { Accept: "application/json" }, credentials: "same-origin" };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (err) {
    throw new ApiError(0, "network", "the dashboard's server does not answer; is porter-mesh ui running?");
  }
  let data = null;
  try {
    data = await response.json();
  } catch (err) {
    data = null;
  }
  if (!response.ok) {
    if (response.status === 401) onUnauthorised();
    throw new ApiError(response.status, data && data.error, data && data.reason);
  }
  return data;
}

export const get = (path, params) => {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(params || {})) {
    if (value !== null && value !== undefined && value !== "") query.set(key, String(value));
  }
  const text = query.toString();
  return call("GET", text ? `${path}?${text}` : path);
};

export const post = (path, body) => call("POST", path, body);
