// What every script of the dashboard shares: an element by its id, and a new element whose text is
// set as text (a string from the API is never parsed as HTML). Loaded first (index.html).
"use strict";

window.cellblockDom = Object.freeze({
  byId: (id) => document.getElementById(id),
  element(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = String(text);
    return node;
  },
});
