// The one way this page builds DOM: el(tag, attrs, ...children).
//
// Every string that came from the mesh (an agent's name, a summary, a SPARQL value)
// reaches the document as a text node or an attribute value, never as markup, so an
// activity whose summary is "<img src=x onerror=...>" shows those characters and runs
// nothing. There is no innerHTML in these scripts; keep it that way.

const EVENT = /^on[a-z]+$/;

/**
 * Make an element.
 * attrs: plain attributes (set with setAttribute), `dataset` (an object), `class`,
 * boolean true/false/null (present/absent), `on<event>` functions (listeners), and
 * `value`/`checked`/`disabled` (set as properties).
 * children: strings and numbers (text nodes), nodes, arrays, null/false (skipped).
 */
export function el(tag, attrs = null, ...children) {
  const node = document.createElement(tag);
  if (attrs) {
    for (const [key, value] of Object.entries(attrs)) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "dataset") {
        for (const [k, v] of Object.entries(value)) {
          if (v !== null && v !== undefined) node.dataset[k] = String(v);
        }
      } else if (EVENT.test(key) && typeof value === "function") {
        node.addEventListener(key.slice(2), value);
      } else if (key === "value" || key === "checked" || key === "disabled") {
        node[key] = value;
      } else {
        node.setAttribute(key, value === true ? "" : String(value));
      }
    }
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(node, child);
    else if (child instanceof Node) node.appendChild(child);
    else node.appendChild(document.createTextNode(String(child)));
  }
}

/** Replace every child of `node` with `children` (same rules as el). */
export function fill(node, ...children) {
  node.replaceChildren();
  append(node, children);
  return node;
}

/** The element with this data-testid (the page's stable names, shared with the tests). */
export function byTestId(id, root = document) {
  return root.querySelector(`[data-testid="${id}"]`);
}

/** "14:03:22.481" for a time in seconds since the epoch. */
export function clock(ts) {
  const d = new Date(ts * 1000);
  const two = (n) => String(n).padStart(2, "0");
  return `${two(d.getHours())}:${two(d.getMinutes())}:${two(d.getSeconds())}.` +
    String(d.getMilliseconds()).padStart(3, "0");
}

/** "3s", "4m", "2h" for an age in seconds. */
export function age(seconds) {
  if (!Number.isFinite(seconds)) return "never";
  if (seconds < 1) return "now";
  if (seconds < 90) return `${Math.round(seconds)}s`;
  if (seconds < 5400) return `${Math.round(seconds / 60)}m`;
  return `${Math.round(seconds / 3600)}h`;
}

/** "just now", "3s ago", "4m ago". */
export function ago(seconds) {
  return seconds < 1.5 ? "just now" : `${age(seconds)} ago`;
}

/** The short id of a task context: "ab12" for "urn:porter:task:ab12". */
export function shortContext(context) {
  const text = String(context);
  const cut = text.lastIndexOf(":");
  return cut >= 0 ? text.slice(cut + 1) : text;
}
