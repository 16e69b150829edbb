// The chat page's message actions: branch navigation (‹ 2 / 3 ›), Edit, Copy, Continue and
// feedback. The conversation is a tree; the page shows one branch, rendered by the server. Switching
// branches stores the choice (POST /api/conversations/<id>/branch/) and loads the page again.
// Each message's data (data-siblings, data-parent, data-status, …) is set by the server or, for the
// messages of this visit, by static/chat.js; this script watches it and keeps each message's
// actions in step. Model output only ever goes into the page as text.
(function () {
  "use strict";
  const chat = document.getElementById("chat");
  const messages = document.getElementById("messages");
  const stopButton = document.getElementById("stop");
  const errorBanner = document.getElementById("request-error");
  if (!chat || !messages) return;
  const FINISHED = ["complete", "stopped", "failed", "flagged"];
  const SCROLL_KEY = "chat-scroll-to";

  function conversationId() {
    return chat.dataset.conversation || "";
  }

  function busy() {
    return stopButton && !stopButton.hidden;
  }

  function showError(text) {
    if (!errorBanner) return;
    errorBanner.textContent = text;
    errorBanner.hidden = !text;
  }

  const csrfToken = window.chatPage.csrfToken;  // static/chat.js, loaded first

  // The conversations API, as the signed-in user (session and CSRF token).
  function api(method, path, body) {
    return fetch("/api/conversations/" + conversationId() + "/" + path, {
      method: method,
      credentials: "same-origin",
      headers: {"Content-Type": "application/json", "X-CSRFToken": csrfToken()},
      body: JSON.stringify(body),
    }).then(function (response) {
      return response.json().catch(function () { return {}; }).then(function (data) {
        if (!response.ok) throw new Error((data.error && data.error.message) || "The request failed.");
        return data;
      });
    });
  }

  // The message's own text: an answer's markdown source (static/chat/render.js draws it), a user
  // message's text.
  function rawText(el) {
    const content = el.querySelector(".content");
    if (!content) return "";
    return window.ChatRender ? window.ChatRender.source(content) : content.textContent;
  }

  function button(className, label, title, onClick) {
    const b = document.createElement("button");
    b.type = "button";
    b.className = "link " + className;
    b.textContent = label;
    if (title) {
      b.title = title;
      b.setAttribute("aria-label", title);
    }
    b.addEventListener("click", onClick);
    return b;
  }

  // Feather's thumbs icons (MIT), drawn as SVG: emoji need a colour font many systems lack.
  const ICONS = {
    up: "M14 9V5a3 3 0 0 0-3-3l-4 9v11h11.28a2 2 0 0 0 2-1.7l1.38-9a2 2 0 0 0-2-2.3zM7 22H4a2 2 0 0 1-2-2v-7a2 2 0 0 1 2-2h3",
    down: "M10 15v4a3 3 0 0 0 3 3l4-9V2H5.72a2 2 0 0 0-2 1.7l-1.38 9a2 2 0 0 0 2 2.3zm7-13h2.67A2.31 2.31 0 0 1 22 4v7a2.31 2.31 0 0 1-2.33 2H17",
  };

  function iconButton(className, icon, title, onClick) {
    const b = button(className, "", title, onClick);
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    const attributes = {viewBox: "0 0 24 24", width: "16", height: "16", fill: "none", stroke: "currentColor",
      "stroke-width": "2", "stroke-linecap": "round", "stroke-linejoin": "round", "aria-hidden": "true"};
    Object.keys(attributes).forEach(function (name) { svg.setAttribute(name, attributes[name]); });
    const path = document.createElementNS(ns, "path");
    path.setAttribute("d", ICONS[icon]);
    svg.appendChild(path);
    b.appendChild(svg);
    return b;
  }

  function siblingsOf(el) {
    return (el.dataset.siblings || "").split(",").filter(Boolean);
  }

  function branchNav(el) {
    const siblings = siblingsOf(el);
    const at = siblings.indexOf(el.dataset.message);
    if (siblings.length < 2 || at < 0) return null;
    const nav = document.createElement("span");
    nav.className = "branch-nav";
    const go = function (to) {
      return function () {
        if (to < 0 || to >= siblings.length || busy()) return;
        api("POST", "branch/", {message: parseInt(siblings[to], 10)}).then(function () {
          sessionStorage.setItem(SCROLL_KEY, siblings[to]);
          window.location.reload();
        }, function (error) { showError(error.message); });
      };
    };
    const prev = button("branch-prev", "‹", "Previous version", go(at - 1));
    prev.disabled = at === 0;
    const position = document.createElement("span");
    position.className = "branch-position";
    position.textContent = (at + 1) + " / " + siblings.length;
    const next = button("branch-next", "›", "Next version", go(at + 1));
    next.disabled = at === siblings.length - 1;
    nav.append(prev, position, next);
    return nav;
  }

  function copyButton(el) {
    const b = button("copy", "Copy", "Copy the message's text", function () {
      const text = rawText(el);
      const done = function () {
        b.textContent = "Copied";
        el.dataset.copied = "true";
        setTimeout(function () { b.textContent = "Copy"; }, 1500);
      };
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(text).then(done, function () { copyByHand(text); done(); });
      } else {
        copyByHand(text);
        done();
      }
    });
    return b;
  }

  function copyByHand(text) {
    const area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.className = "offscreen";
    document.body.appendChild(area);
    area.select();
    try { document.execCommand("copy"); } catch (e) { /* nothing more to try */ }
    area.remove();
  }

  // Edit: the new text is sent beside this message (the same parent), a new branch; the old stays.
  function startEdit(el) {
    if (busy() || el.querySelector(".edit-form")) return;
    const form = document.createElement("form");
    form.className = "edit-form";
    const area = document.createElement("textarea");
    area.value = rawText(el);
    area.rows = 3;
    area.setAttribute("aria-label", "Edit message");
    const send = document.createElement("button");
    send.type = "submit";
    send.className = "edit-send";
    send.textContent = "Send";
    const cancel = button("edit-cancel", "Cancel", "", function () { endEdit(el); });
    form.append(area, send, cancel);
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      const text = area.value.trim();
      if (!text) return;
      const parent = el.dataset.parent ? parseInt(el.dataset.parent, 10) : null;
      if (!window.chatPage || !window.chatPage.sendFrom(parent, text, el)) {
        showError("Wait for the answer being written, or stop it, before sending an edit.");
      }
    });
    el.classList.add("editing");
    el.appendChild(form);
    area.focus();
  }

  function endEdit(el) {
    el.classList.remove("editing");
    const form = el.querySelector(".edit-form");
    if (form) form.remove();
  }

  function feedback(el) {
    const box = document.createElement("span");
    box.className = "feedback";
    // The thumb already chosen, clicked again, takes the rating (and its comment) back.
    const rate = function (rating) {
      return function () {
        const path = "messages/" + el.dataset.message + "/feedback/";
        const clearing = el.dataset.rating === rating;
        const request = clearing ? api("DELETE", path) : api("PUT", path, {rating: rating});
        request.then(function () {
          el.dataset.rating = clearing ? "" : rating;
          markRating(box, el.dataset.rating);
          if (clearing) {
            const form = el.querySelector(".feedback-form");
            if (form) form.remove();
          } else {
            commentForm(el, rating);
          }
        }, function (error) { showError(error.message); });
      };
    };
    box.append(iconButton("rate-up", "up", "Good answer", rate("up")), iconButton("rate-down", "down", "Bad answer", rate("down")));
    markRating(box, el.dataset.rating || "");
    return box;
  }

  function markRating(box, rating) {
    box.querySelector(".rate-up").setAttribute("aria-pressed", String(rating === "up"));
    box.querySelector(".rate-down").setAttribute("aria-pressed", String(rating === "down"));
  }

  // An optional comment with the rating, sent with it again.
  function commentForm(el, rating) {
    let form = el.querySelector(".feedback-form");
    if (form) form.remove();
    form = document.createElement("form");
    form.className = "feedback-form";
    const area = document.createElement("textarea");
    area.rows = 2;
    area.maxLength = 2000;
    area.placeholder = "What was good or bad about it? (optional)";
    area.setAttribute("aria-label", "Feedback comment");
    const send = document.createElement("button");
    send.type = "submit";
    send.textContent = "Send feedback";
    form.append(area, send, button("feedback-close", "Close", "", function () { form.remove(); }));
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      api("PUT", "messages/" + el.dataset.message + "/feedback/", {rating: rating, comment: area.value})
        .then(function () {
          form.remove();
          el.dataset.feedbackSent = "true";
        }, function (error) { showError(error.message); });
    });
    const actions = el.querySelector(":scope > .actions");
    if (actions) actions.after(form);  // under the thumbs, above Regenerate
    else el.appendChild(form);
  }

  function isLast(el) {
    return messages.querySelector("article.message:last-of-type") === el;
  }

  function decorate(el) {
    if (el.classList.contains("editing")) return;
    const old = el.querySelector(":scope > .actions");
    const actions = document.createElement("div");
    actions.className = "actions";
    if (el.dataset.message) {
      const nav = branchNav(el);
      if (nav) actions.appendChild(nav);
      actions.appendChild(copyButton(el));
      const finished = FINISHED.indexOf(el.dataset.status) >= 0;
      if (el.classList.contains("user") && !busy()) {
        actions.appendChild(button("edit", "Edit", "Edit and send again as a new branch", function () { startEdit(el); }));
      }
      if (el.classList.contains("assistant") && finished) {
        actions.appendChild(feedback(el));
        if (el.dataset.status === "complete" && el.dataset.finishReason === "length" && isLast(el) && !busy()) {
          actions.appendChild(button("continue", "Continue", "Continue writing this answer", function () {
            if (!window.chatPage) return;
            window.chatPage.requestAnswer({
              type: "message.continue",
              message: parseInt(el.dataset.message, 10),
              replaces: el.dataset.generation || null,
            });
          }));
        }
      }
    }
    // The row goes last but for a comment form and Regenerate, so the order is the same live (where
    // chat.js adds notes and Regenerate after this row) as after a reload (where they come first).
    if (old) old.remove();
    el.insertBefore(actions, el.querySelector(":scope > .feedback-form, :scope > button.regenerate"));
  }

  function decorateAll() {
    messages.querySelectorAll("article.message").forEach(decorate);
  }

  let queued = false;
  function soon() {
    if (queued) return;
    queued = true;
    Promise.resolve().then(function () {
      queued = false;
      decorateAll();
    });
  }

  // Messages come and go, change state, and take ids; Stop shows while an answer is written.
  new MutationObserver(soon).observe(messages, {childList: true});
  new MutationObserver(soon).observe(messages, {
    subtree: true,
    attributes: true,
    attributeFilter: ["data-message", "data-status", "data-siblings", "data-finish-reason"],
  });
  if (stopButton) new MutationObserver(soon).observe(stopButton, {attributes: true, attributeFilter: ["hidden"]});
  chat.addEventListener("chat:frame", function (event) {
    if (event.detail.type === "message.accepted" || event.detail.type === "message.blocked") {
      messages.querySelectorAll("article.message.editing").forEach(endEdit);
    }
  });

  decorateAll();
  const target = sessionStorage.getItem(SCROLL_KEY);
  if (target) {
    sessionStorage.removeItem(SCROLL_KEY);
    const el = messages.querySelector('article[data-message="' + target + '"]');
    if (el) el.scrollIntoView({block: "center"});
  }
})();
