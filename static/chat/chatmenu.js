// The sidebar's "…" menu on each chat (Rename, Pin/Unpin, Share, Export as Markdown or JSON,
// Archive, Delete), Select mode (delete or archive several chats at once) and the Archived view.
// It watches the list (a MutationObserver) rather than being called by sidebar.js, which draws it:
// each chat's link gets its menu button beside it, wherever sidebar.js puts the link. Titles only
// ever go in as text.
//
// The menu is a WAI-ARIA menu button: Enter, Space or ArrowDown opens it on its first item (ArrowUp
// on its last), the arrows, Home and End move, Esc closes it and gives the focus back, Tab or a
// click outside closes it.
//
// Other scripts add items to it (after Export, before Archive and Delete) with:
//
//   window.chatMenu.addItem({
//     label: "Move to project",  // text; or a function (conversationId, link) returning text, or
//                                // "" to leave the item out of this chat's menu
//     onSelect: function (conversationId, link) { ... },  // once the menu has closed
//     danger: false,             // optional: drawn in the danger colour
//   });
//
// `conversationId` is the chat's id (a number) and `link` its <a class="conversation-link"> in the
// list. An item shows from the next opening of a menu. A script loaded before this one waits for
// the document's "chatmenu:ready" event; window.chatMenu.refresh() draws the list again from the
// server after a change it made.
(function () {
  "use strict";
  const chat = document.getElementById("chat");
  const list = document.getElementById("conversation-list");
  const newChat = document.getElementById("new-chat");
  const announcer = document.getElementById("announcer");
  const errorBanner = document.getElementById("request-error");
  const selectButton = document.getElementById("select-chats");
  const selectedCount = document.getElementById("selected-count");
  const archiveSelected = document.getElementById("archive-selected");
  const deleteSelected = document.getElementById("delete-selected");
  const archivedLink = document.getElementById("archived-link");
  const DELETE_QUESTION = document.getElementById("delete-form").dataset.confirm || "Delete this conversation?";
  const extraItems = [];

  // --- talking to the server -----------------------------------------------------------------------

  function currentId() {
    return chat.dataset.conversation ? parseInt(chat.dataset.conversation, 10) : null;
  }

  function pageUrl(id, suffix) {
    return chat.dataset.conversationUrl.replace("/0/", "/" + id + "/") + (suffix || "");
  }

  const csrfToken = window.chatPage.csrfToken;  // static/chat.js, loaded first

  // A request to one of the page's endpoints (`form`: fields posted as a form) or to the
  // conversations API (`json`: a body); resolves with its JSON, rejects with its message.
  function request(method, url, options) {
    const headers = {"X-CSRFToken": csrfToken(), "Accept": "application/json"};
    let body;
    if (options && options.json !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(options.json);
    } else if (options && options.form) {
      body = new URLSearchParams(options.form);
    }
    return fetch(url, {method: method, credentials: "same-origin", headers: headers, body: body})
      .then(function (response) {
        return response.json().catch(function () { return {}; }).then(function (answer) {
          if (!response.ok) throw new Error((answer.error && answer.error.message) || "That did not work. Try again.");
          return answer;
        });
      });
  }

  function apiUrl(id, suffix) {
    return "/api/conversations/" + (id === null ? "" : id + "/") + (suffix || "");
  }

  function announce(text) {
    announcer.textContent = "";
    setTimeout(function () { announcer.textContent = text; }, 50);
  }

  function showError(text) {
    errorBanner.textContent = text;
    errorBanner.hidden = !text;
  }

  function refresh() {
    return window.chatSidebar ? window.chatSidebar.refresh() : Promise.resolve();
  }

  // After the chats shown were deleted or archived: the open one gone means a new chat. A focus on
  // one of their buttons moves to the next chat's (or to the search box), not to the page's start.
  function gone(ids, said) {
    if (ids.indexOf(currentId()) >= 0) {
      window.location.assign(newChat.href);
      return;
    }
    const focused = document.activeElement;
    const wasOnOne = focused && focused.matches && focused.matches("button.chat-menu-button") &&
      ids.indexOf(parseInt(focused.dataset.conversation, 10)) >= 0;
    const links = Array.prototype.slice.call(list.querySelectorAll("a.conversation-link"));
    const next = links.find(function (link, i) {
      return i > 0 && ids.indexOf(parseInt(links[i - 1].dataset.conversation, 10)) >= 0 &&
        ids.indexOf(parseInt(link.dataset.conversation, 10)) < 0;
    });
    if (wasOnOne) {
      const button = next && buttonFor(next.dataset.conversation);
      (button || document.getElementById("conversation-search")).focus();
    }
    ids.forEach(function (id) {
      const link = linkFor(id);
      if (link) link.remove();
    });
    sync();  // their buttons go now, not when the observer runs
    announce(said);
    refresh();  // the focus goes on through the list drawn anew (followRedraw)
  }

  // --- a menu button beside each chat of the list ----------------------------------------------------

  function linkFor(id) {
    return list.querySelector('a.conversation-link[data-conversation="' + id + '"]');
  }

  function buttonFor(id) {
    return list.querySelector('button.chat-menu-button[data-conversation="' + id + '"]');
  }

  function titleOf(link) {
    return link.querySelector("input") ? null : link.textContent;
  }

  function makeButton(id) {
    const button = document.createElement("button");
    button.type = "button";
    button.className = "chat-menu-button";
    button.dataset.conversation = id;
    button.setAttribute("aria-haspopup", "menu");
    button.setAttribute("aria-expanded", "false");
    button.setAttribute("aria-controls", "chat-menu");
    button.textContent = "…";
    return button;
  }

  function makeCheckbox(id) {
    const box = document.createElement("input");
    box.type = "checkbox";
    box.className = "chat-select";
    box.dataset.conversation = id;
    return box;
  }

  let selecting = false;

  // Each link with its button after it (and, while selecting, its checkbox before it); nothing
  // left over for a link that has gone. Running it again changes nothing, so its own changes end
  // the observer's round.
  function sync() {
    const ids = new Set();
    list.querySelectorAll("a.conversation-link").forEach(function (link) {
      const id = link.dataset.conversation;
      ids.add(id);
      const button = buttonFor(id) || makeButton(id);
      if (link.nextElementSibling !== button) link.after(button);
      const title = titleOf(link);
      if (title !== null && button.getAttribute("aria-label") !== "Options for " + title) {
        button.setAttribute("aria-label", "Options for " + title);
      }
      let box = list.querySelector('input.chat-select[data-conversation="' + id + '"]');
      if (selecting) {
        if (!box) box = makeCheckbox(id);
        if (link.previousElementSibling !== box) link.before(box);
        if (title !== null && box.getAttribute("aria-label") !== "Select " + title) box.setAttribute("aria-label", "Select " + title);
      } else if (box) {
        box.remove();
      }
    });
    list.querySelectorAll("button.chat-menu-button, input.chat-select").forEach(function (el) {
      if (!ids.has(el.dataset.conversation)) el.remove();
    });
    if (selecting) countShow();
    followRedraw();
  }

  // The list is drawn anew by others (sidebar.js, a search, a move into a project), at any moment:
  // an open menu goes on from the chat's new button (so closing it gives the focus back there), and a focus inside the list goes on with the
  // same chat's new link or button (or the search box, if the chat has gone), never to the page's start.
  let focusedInList = null;  // {element, selector, id}: the last thing focused inside the list
  document.addEventListener("focusin", function (event) {
    const el = event.target;
    const kind = list.contains(el) && ["a.conversation-link", "button.chat-menu-button", "input.chat-select"]
      .find(function (selector) { return el.matches(selector); });
    focusedInList = kind ? {element: el, selector: kind, id: el.dataset.conversation} : null;
  });
  // A click elsewhere leaves the list on purpose (the focus may go to the page's body): not followed.
  document.addEventListener("pointerdown", function (event) {
    if (!list.contains(event.target)) focusedInList = null;
  }, true);

  function followRedraw() {
    if (opener && !opener.isConnected) {
      const button = buttonFor(opener.dataset.conversation);
      if (button) {
        opener = button;
        button.setAttribute("aria-expanded", "true");
      } else {
        close(false);
      }
    }
    const was = focusedInList;
    const now = document.activeElement;
    if (!was || was.element.isConnected || (now && now !== document.body)) return;
    const same = list.querySelector(was.selector + '[data-conversation="' + was.id + '"]');
    (same || document.getElementById("conversation-search")).focus();
  }

  // --- the menu ------------------------------------------------------------------------------------

  const menu = document.createElement("div");
  menu.className = "chat-menu";
  menu.id = "chat-menu";
  menu.setAttribute("role", "menu");
  menu.hidden = true;
  document.body.appendChild(menu);
  let opener = null;  // the button whose menu is open

  // The list is watched from here on (the menu and its opener exist now).
  new MutationObserver(sync).observe(list, {childList: true, subtree: true, characterData: true});
  sync();

  function items() {
    return Array.prototype.slice.call(menu.querySelectorAll("[role=menuitem]"));
  }

  function addEntry(label, action, options) {
    const el = document.createElement(options && options.href ? "a" : "button");
    el.className = "chat-menu-item" + (options && options.danger ? " danger" : "");
    el.setAttribute("role", "menuitem");
    el.tabIndex = -1;
    el.textContent = label;
    if (options && options.href) {
      el.href = options.href;
      el.setAttribute("download", "");
    } else {
      el.type = "button";
    }
    if (options && options.name) el.dataset.action = options.name;
    el.addEventListener("click", function () {
      const button = opener;
      close(true);
      if (action) action(parseInt(button.dataset.conversation, 10), linkFor(button.dataset.conversation));
    });
    menu.appendChild(el);
  }

  function separator() {
    const line = document.createElement("div");
    line.setAttribute("role", "separator");
    menu.appendChild(line);
  }

  function build(id, link) {
    menu.textContent = "";
    menu.setAttribute("aria-label", "Options for " + (titleOf(link) || "this chat"));
    const pinned = link.dataset.pinned === "true";
    addEntry("Rename", rename, {name: "rename"});
    addEntry(pinned ? "Unpin" : "Pin", function (cid) { pin(cid, !pinned); }, {name: "pin"});
    addEntry("Share", share, {name: "share"});
    addEntry("Export as Markdown", null, {name: "export-markdown", href: pageUrl(id, "export.md")});
    addEntry("Export as JSON", null, {name: "export-json", href: pageUrl(id, "export.json")});
    extraItems.forEach(function (item) {
      const label = typeof item.label === "function" ? item.label(id, link) : item.label;
      if (label) addEntry(String(label), item.onSelect, {danger: item.danger});
    });
    separator();
    addEntry("Archive", archive, {name: "archive"});
    addEntry("Delete", remove, {name: "delete", danger: true});
  }

  // Below the button, or above it where there is no room; always inside the window.
  function place(button) {
    const margin = 8;
    const b = button.getBoundingClientRect();
    const m = menu.getBoundingClientRect();
    let top = b.bottom + 4;
    if (top + m.height > window.innerHeight - margin) top = b.top - m.height - 4;
    let left = b.left;
    left = Math.max(margin, Math.min(left, window.innerWidth - m.width - margin));
    top = Math.max(margin, Math.min(top, window.innerHeight - m.height - margin));
    menu.style.left = left + "px";
    menu.style.top = top + "px";
  }

  function open(button, focusLast) {
    if (opener) close(false);
    const link = linkFor(button.dataset.conversation);
    if (!link) return;
    build(parseInt(button.dataset.conversation, 10), link);
    opener = button;
    button.setAttribute("aria-expanded", "true");
    menu.hidden = false;
    place(button);
    const all = items();
    all[focusLast ? all.length - 1 : 0].focus();
  }

  function close(refocus) {
    if (!opener) return;
    const button = opener;
    opener = null;
    menu.hidden = true;
    button.setAttribute("aria-expanded", "false");
    if (refocus && button.isConnected) button.focus();
  }

  list.addEventListener("click", function (event) {
    const button = event.target.closest("button.chat-menu-button");
    if (!button) return;
    event.preventDefault();
    if (opener === button) close(true);
    else open(button, false);
  });
  list.addEventListener("keydown", function (event) {
    const button = event.target.closest("button.chat-menu-button");
    if (!button || (event.key !== "ArrowDown" && event.key !== "ArrowUp")) return;
    event.preventDefault();
    open(button, event.key === "ArrowUp");
  });

  menu.addEventListener("keydown", function (event) {
    const all = items();
    const at = all.indexOf(document.activeElement);
    let next = null;
    switch (event.key) {
      case "ArrowDown": next = all[(at + 1) % all.length]; break;
      case "ArrowUp": next = all[(at - 1 + all.length) % all.length]; break;
      case "Home": next = all[0]; break;
      case "End": next = all[all.length - 1]; break;
      case "Escape":
        close(true);
        break;
      case "Tab":
        close(true);  // back on its button, from where Tab goes on
        break;
      case " ":
      case "Enter":
        if (at >= 0) all[at].click();
        break;
      default:
        return;
    }
    event.preventDefault();
    event.stopPropagation();  // Esc here closes the menu only, not the phone's drawer (layout.js)
    if (next) next.focus();
  });
  menu.addEventListener("mouseover", function (event) {
    const item = event.target.closest("[role=menuitem]");
    if (item) item.focus();
  });
  document.addEventListener("pointerdown", function (event) {
    if (opener && !menu.contains(event.target) && !opener.contains(event.target)) close(false);
  }, true);
  window.addEventListener("resize", function () { close(false); });
  list.addEventListener("scroll", function () { close(false); });

  // --- what the items do ---------------------------------------------------------------------------

  function rename(id) {
    if (window.chatSidebar) window.chatSidebar.rename(id);
  }

  function pin(id, pinned) {
    request("POST", pageUrl(id, "pin/"), {form: {pinned: pinned ? "true" : "false"}})
      .then(function (answer) {
        showError("");
        announce(answer.pinned ? "Pinned." : "Unpinned.");
        if (!window.chatSidebar) return;
        const hadFocus = document.activeElement === buttonFor(id);
        // The list is drawn anew: the focus goes on with the chat's new button.
        window.chatSidebar.pinned(id, answer.pinned).then(function () {
          const button = buttonFor(id);
          if (hadFocus && button && document.activeElement !== button) button.focus();
        });
      })
      .catch(function (error) { showError(error.message); });
  }

  function archive(id) {
    request("POST", apiUrl(id, "archive/"))
      .then(function () { showError(""); gone([id], "Archived."); })
      .catch(function (error) { showError(error.message); });
  }

  function remove(id) {
    if (!window.confirm(DELETE_QUESTION)) return;
    request("DELETE", apiUrl(id))
      .then(function () { showError(""); gone([id], "Deleted."); })
      .catch(function (error) { showError(error.message); });
  }

  // --- dialogs: a chat's shared link, and the Archived view ------------------------------------------

  function dialog(id, heading) {
    const box = document.createElement("dialog");
    box.className = "chat-dialog";
    box.id = id;
    box.setAttribute("aria-labelledby", id + "-title");
    const title = document.createElement("h2");
    title.id = id + "-title";
    title.textContent = heading;
    const body = document.createElement("div");
    body.className = "chat-dialog-body";
    const footer = document.createElement("div");
    footer.className = "chat-dialog-footer";
    const done = document.createElement("button");
    done.type = "button";
    done.className = "chat-dialog-close";
    done.textContent = "Close";
    done.addEventListener("click", function () { box.close(); });
    footer.appendChild(done);
    box.append(title, body, footer);
    // A click on the backdrop (outside the dialog's box) closes it too.
    box.addEventListener("click", function (event) {
      if (event.target !== box) return;
      const r = box.getBoundingClientRect();
      if (event.clientX < r.left || event.clientX > r.right || event.clientY < r.top || event.clientY > r.bottom) box.close();
    });
    // Esc closes the dialog only (its own default), not the phone's drawer behind it (layout.js).
    box.addEventListener("keydown", function (event) {
      if (event.key === "Escape") event.stopPropagation();
    });
    document.body.appendChild(box);
    return {box: box, body: body};
  }

  const sharing = dialog("share-dialog", "Share");
  const shareNote = document.createElement("p");
  shareNote.textContent = "Read-only link to a copy of the messages on screen when it was made:";
  const shareField = document.createElement("input");
  shareField.type = "text";
  shareField.readOnly = true;
  shareField.id = "share-dialog-url";
  shareField.setAttribute("aria-label", "Shared link");
  const shareCopy = document.createElement("button");
  shareCopy.type = "button";
  shareCopy.id = "share-dialog-copy";
  shareCopy.textContent = "Copy link";
  const shareCopied = document.createElement("span");
  shareCopied.className = "copied-notice";
  shareCopied.id = "share-dialog-copied";
  shareCopied.setAttribute("role", "status");
  const shareRow = document.createElement("div");
  shareRow.className = "share-dialog-row";
  shareRow.append(shareField, shareCopy);
  sharing.body.append(shareNote, shareRow, shareCopied);

  function share(id) {
    request("POST", pageUrl(id, "share/"))
      .then(function (answer) {
        showError("");
        shareField.value = answer.url;
        shareCopied.textContent = "";
        sharing.box.showModal();
        shareField.select();
      })
      .catch(function (error) { showError(error.message); });
  }

  shareCopy.addEventListener("click", function () {
    shareField.select();
    const copied = navigator.clipboard && window.isSecureContext
      ? navigator.clipboard.writeText(shareField.value)
      : (document.execCommand("copy") ? Promise.resolve() : Promise.reject(new Error("not copied")));
    copied.then(
      function () { shareCopied.textContent = "Copied"; },
      function () { shareCopied.textContent = "Press Ctrl+C (⌘C on a Mac) to copy the selected link."; }
    );
  });

  const archived = dialog("archived-dialog", "Archived chats");
  const archivedList = document.createElement("ul");
  archivedList.className = "archived-list";
  const archivedEmpty = document.createElement("p");
  archivedEmpty.className = "muted";
  archivedEmpty.id = "archived-empty";
  archivedEmpty.textContent = "No archived chats.";
  archivedEmpty.hidden = true;
  archived.body.append(archivedList, archivedEmpty);

  function archivedRow(conversation) {
    const row = document.createElement("li");
    row.dataset.conversation = String(conversation.id);
    const link = document.createElement("a");
    link.href = pageUrl(conversation.id);
    link.textContent = conversation.title;
    const back = document.createElement("button");
    back.type = "button";
    back.className = "link";
    back.dataset.action = "unarchive";
    back.textContent = "Unarchive";
    back.setAttribute("aria-label", "Unarchive " + conversation.title);
    const drop = document.createElement("button");
    drop.type = "button";
    drop.className = "link danger";
    drop.dataset.action = "delete";
    drop.textContent = "Delete";
    drop.setAttribute("aria-label", "Delete " + conversation.title);
    back.addEventListener("click", function () {
      request("DELETE", apiUrl(conversation.id, "archive/"))
        .then(function () { rowGone(row, "Unarchived."); refresh(); })
        .catch(function (error) { showError(error.message); });
    });
    drop.addEventListener("click", function () {
      if (!window.confirm(DELETE_QUESTION)) return;
      request("DELETE", apiUrl(conversation.id))
        .then(function () {
          if (conversation.id === currentId()) window.location.assign(newChat.href);
          else rowGone(row, "Deleted.");
        })
        .catch(function (error) { showError(error.message); });
    });
    row.append(link, back, drop);
    return row;
  }

  function rowGone(row, said) {
    const next = row.nextElementSibling || row.previousElementSibling;
    row.remove();
    archivedEmpty.hidden = archivedList.children.length > 0;
    (next ? next.querySelector("button") : archived.box.querySelector(".chat-dialog-close")).focus();
    announce(said);
  }

  archivedLink.addEventListener("click", function () {
    request("GET", apiUrl(null, "?archived=true&limit=100"))
      .then(function (answer) {
        archivedList.textContent = "";
        (answer.results || []).forEach(function (c) { archivedList.appendChild(archivedRow(c)); });
        archivedEmpty.hidden = archivedList.children.length > 0;
        archived.box.showModal();
      })
      .catch(function (error) { showError(error.message); });
  });

  // --- Select mode ---------------------------------------------------------------------------------

  function chosen() {
    return Array.prototype.map.call(list.querySelectorAll("input.chat-select:checked"), function (box) {
      return parseInt(box.dataset.conversation, 10);
    });
  }

  function countShow() {
    const n = chosen().length;
    const text = n + " selected";
    if (selectedCount.textContent !== text) selectedCount.textContent = text;
    archiveSelected.disabled = deleteSelected.disabled = n === 0;
  }

  function selectMode(on) {
    selecting = on;
    list.classList.toggle("selecting", on);
    selectButton.setAttribute("aria-pressed", String(on));
    selectButton.textContent = on ? "Cancel" : "Select";
    selectedCount.hidden = archiveSelected.hidden = deleteSelected.hidden = !on;
    close(false);
    sync();
  }

  selectButton.addEventListener("click", function () { selectMode(!selecting); });
  list.addEventListener("change", function (event) {
    if (event.target.matches("input.chat-select")) countShow();
  });
  // While selecting, a click on a chat (a wide target, on a phone too) ticks it instead of opening it.
  list.addEventListener("click", function (event) {
    const link = selecting && event.target.closest("a.conversation-link");
    if (!link || link.querySelector("input")) return;
    event.preventDefault();
    const box = list.querySelector('input.chat-select[data-conversation="' + link.dataset.conversation + '"]');
    if (box) {
      box.checked = !box.checked;
      countShow();
    }
  });

  function many(path, ids, said) {
    return request("POST", apiUrl(null, path), {json: {ids: ids}})
      .then(function () { showError(""); selectMode(false); gone(ids, said); })
      .catch(function (error) { showError(error.message); });
  }

  deleteSelected.addEventListener("click", function () {
    const ids = chosen();
    if (!ids.length) return;
    const question = ids.length === 1 ? DELETE_QUESTION : "Delete these " + ids.length + " conversations?";
    if (!window.confirm(question)) return;
    many("bulk-delete/", ids, ids.length === 1 ? "Deleted." : "Deleted " + ids.length + " chats.");
  });
  archiveSelected.addEventListener("click", function () {
    const ids = chosen();
    if (ids.length) many("bulk-archive/", ids, ids.length === 1 ? "Archived." : "Archived " + ids.length + " chats.");
  });

  // --- for other scripts -----------------------------------------------------------------------------

  window.chatMenu = {
    addItem: function (item) {
      if (!item || typeof item.onSelect !== "function") throw new TypeError("chatMenu.addItem needs {label, onSelect}");
      extraItems.push({label: item.label, onSelect: item.onSelect, danger: Boolean(item.danger)});
    },
    refresh: refresh,
  };
  document.dispatchEvent(new CustomEvent("chatmenu:ready"));
})();
