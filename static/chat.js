// The chat page: one WebSocket, streamed answers, Stop, and resume after a reconnect or reload.
// Model output is untrusted: answers are drawn by ChatRender (chat/render.js), which renders their
// markdown inert and sanitized; everything else goes into the page as text (textContent).
(function () {
  "use strict";
  const chat = document.getElementById("chat");
  const messages = document.getElementById("messages");
  const form = document.getElementById("composer");
  const input = document.getElementById("input");
  const sendButton = document.getElementById("send");
  const stopButton = document.getElementById("stop");
  const engineBanner = document.getElementById("engine-status");
  const connectionBanner = document.getElementById("connection-status");
  const errorBanner = document.getElementById("request-error");
  const modelSelect = document.getElementById("model");

  const ENGINE_STATES = {
    loading: "The model is loading. You can send a message now; the answer starts as soon as it is ready.",
    idle: "The model is loading. You can send a message now; the answer starts as soon as it is ready.",
    offline: "No server is running this model right now. Your message will wait until one starts.",
    failed: "The model failed to load. Ask an administrator to check the server log.",
  };
  let conversationId = chat.dataset.conversation ? parseInt(chat.dataset.conversation, 10) : null;
  let socket = null;
  let retryDelay = 500;
  let sending = null;             // {payload, userEl, assistantEl} while a send waits for its answer
  let regenerating = null;        // the message.regenerate (or .continue) frame while it waits for its answer
  let stopOnArrival = false;      // Stop was asked for while `regenerating` waited: its answer is stopped when it begins
  const streams = new Map();      // generation id -> {el, seq}
  const TOOL_COMMANDS = {search: "web_search", files: "search_files", fetch: "fetch_page", run: "run_code"};

  function wsUrl() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    return scheme + location.host + chat.dataset.wsPath;
  }

  function setBusy(busy) {
    sendButton.hidden = busy;
    stopButton.hidden = !busy;
    input.disabled = false;
  }

  function showError(text) {
    errorBanner.textContent = text;
    errorBanner.hidden = !text;
  }

  // The deployment that writes an answer (the router's choice, or a regenerate's model): said under
  // every answer, replacing what a regenerated answer said before.
  function answeredBy(el, model) {
    el.dataset.model = model;
    el.querySelectorAll(":scope > .answered-by").forEach(function (n) { n.remove(); });
    const line = document.createElement("div");
    line.className = "answered-by";
    line.textContent = "Answered by " + model;
    el.querySelector(":scope > .content").after(line);
  }

  // Where a long conversation's summary begins (orchestration's memory): put after the last message it
  // stands for when that message is on screen, replacing the one shown before. Its text is the model's,
  // so it is set as text, never as markup.
  function showSummary(msg) {
    if (msg.conversation !== conversationId) return;
    const through = messages.querySelector('article[data-message="' + msg.through + '"]');
    if (!through) return;  // another branch is on screen
    const old = document.getElementById("memory-summary");
    if (old) old.remove();
    const marker = document.createElement("details");
    marker.className = "memory-summary";
    marker.id = "memory-summary";
    marker.dataset.through = String(msg.through);
    const label = document.createElement("summary");
    label.textContent = "Earlier messages are summarized: the model sees this summary instead of the messages above.";
    const text = document.createElement("div");
    text.className = "summary-text";
    msg.text.split("\n").forEach((line, i) => {
      if (i) text.appendChild(document.createElement("br"));
      text.appendChild(document.createTextNode(line));
    });
    marker.append(label, text);
    through.after(marker);
  }

  // "Ask anything." while no message is on the page (a message taken back leaves none).
  function showEmpty() {
    const empty = document.getElementById("empty");
    if (empty) empty.hidden = messages.querySelector("article.message") !== null;
  }

  function addMessage(role, text, status) {
    const el = document.createElement("article");
    el.className = "message " + role + " status-" + status;
    el.dataset.status = status;
    const content = document.createElement("div");
    content.className = "content";
    content.textContent = text;
    el.appendChild(content);
    messages.appendChild(el);
    showEmpty();
    return el;
  }

  // A user message's images: each a thumbnail (its owner's only, served as an image and nothing else)
  // and what OCR read in it, as text. The server renders the same on a reload.
  function withImages(el, images) {
    if (!images || !images.length) return el;
    const box = document.createElement("div");
    box.className = "message-images";
    images.forEach(function (image) {
      const figure = document.createElement("figure");
      figure.className = "message-image";
      figure.dataset.document = image.id;
      const img = document.createElement("img");
      img.src = "/api/files/" + encodeURIComponent(image.id) + "/thumbnail/";
      img.alt = image.name;
      img.loading = "lazy";
      const caption = document.createElement("figcaption");
      caption.textContent = imageCaption(image);
      figure.append(img, caption);
      box.appendChild(figure);
    });
    el.insertBefore(box, el.querySelector(".content"));
    return el;
  }

  function imageCaption(image) {
    if (!image.ocr_text) return image.name + " · no text found in it";
    const sure = image.ocr_confidence === null || image.ocr_confidence === undefined ? "" : ", confidence " + Math.round(image.ocr_confidence) + "%";
    return image.name + " · read from the image (OCR" + sure + "): " + image.ocr_text;
  }

  function addNote(el, text, isError, kind) {
    const note = document.createElement("div");
    note.className = "note" + (isError ? " error" : "") + (kind ? " " + kind : "");
    note.textContent = text;
    el.appendChild(note);
  }

  function setStatus(el, status) {
    el.className = el.className.replace(/status-\S+/, "status-" + status);
    el.dataset.status = status;
  }

  // Offer "Regenerate" on the newest answer once nothing is being written.
  function refreshRegenerate() {
    messages.querySelectorAll("button.regenerate").forEach(function (b) { b.remove(); });
    const last = messages.querySelector("article.message:last-of-type");
    if (streams.size || sending || regenerating) return;
    if (!last || !last.classList.contains("assistant") || !last.dataset.message) return;
    if (["failed", "stopped", "complete"].indexOf(last.dataset.status) < 0) return;
    const button = document.createElement("button");
    button.type = "button";
    button.className = "regenerate link";
    button.textContent = last.dataset.status === "failed" ? "Retry" : "Regenerate";
    button.addEventListener("click", function () {
      // `replaces`: the newest answer to this question the page knows of. Sent again on the next
      // socket if this one drops before the server answers, it regenerates once: a repeat is
      // answered with the answer it began (a new one beside this, shown in its place).
      button.remove();
      showError("");
      requestAnswer({
        type: "message.regenerate",
        message: parseInt(last.dataset.message, 10),
        replaces: last.dataset.newestGeneration || last.dataset.generation || null,
      });
    });
    last.appendChild(button);
  }

  // A regenerate or continue: kept until the server answers it, and sent again on the next socket.
  // The page is busy from the click (Stop shown), not from the server's answer, which may be slow.
  function requestAnswer(frame) {
    if (sending || regenerating || streams.size > 0) return false;
    regenerating = frame;
    stopOnArrival = false;
    showError("");
    setBusy(true);
    refreshRegenerate();
    if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(regenerating));
    return true;
  }

  function newClientId() {
    if (crypto.randomUUID) return crypto.randomUUID();
    // Pages served over plain HTTP (not localhost) have no randomUUID: a version 4 UUID by hand.
    const b = crypto.getRandomValues(new Uint8Array(16));
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    const hex = Array.from(b, function (x) { return x.toString(16).padStart(2, "0"); }).join("");
    return hex.slice(0, 8) + "-" + hex.slice(8, 12) + "-" + hex.slice(12, 16) + "-" + hex.slice(16, 20) + "-" + hex.slice(20);
  }

  // Send the pending message on the socket open now. If that socket drops before the server
  // answers, the next one sends it again, marked as a retry: the server saves a client_id once and
  // answers a repeat with what it saved, so the message is neither lost nor sent twice.
  function transmit() {
    socket.send(JSON.stringify(sending.payload));
    sending.payload.retry = true;
  }

  // The pending message comes off the page and back into the input.
  function takeBack() {
    sending.userEl.remove();
    sending.assistantEl.remove();
    // An edit puts back the branch it was to replace on the page.
    (sending.removed || []).forEach(function (el) { messages.appendChild(el); });
    showEmpty();
    input.value = sending.payload.content;
    // As if typed: the composer grows to the text (static/chat/layout.js listens).
    input.dispatchEvent(new Event("input", {bubbles: true}));
    sending = null;
    setBusy(streams.size > 0);
  }

  // The server answered the pending regenerate or continue of answer `messageId`: true if it was ours.
  function answerArrived(messageId) {
    if (!regenerating || regenerating.message !== messageId) return false;
    regenerating = null;
    return true;
  }

  // Stop was pressed before the server answered: the answer it began is stopped now.
  function stopIfAsked(generationId) {
    if (!stopOnArrival) return;
    stopOnArrival = false;
    if (socket && socket.readyState === WebSocket.OPEN) {
      socket.send(JSON.stringify({type: "generation.stop", generation: generationId}));
    }
  }

  function isOurs(msg) {
    return sending !== null && msg.client_id === sending.payload.client_id;
  }

  function follow(generationId, el, afterSeq) {
    streams.set(generationId, {el: el, seq: afterSeq || 0, heard: Date.now(), since: performance.now()});
    el.dataset.generation = generationId;
    setBusy(true);
  }

  // Set once a navigation away from this page starts (a link, a form such as "Log out").
  let leaving = false;
  window.addEventListener("beforeunload", function () { leaving = true; });

  function connect() {
    socket = new WebSocket(wsUrl());
    socket.addEventListener("open", function () {
      retryDelay = 500;
      chat.dataset.socket = "open";  // what a message can be sent on (the browser tests wait for it)
      connectionBanner.hidden = true;
      // Resume every answer still being written: after a reload, or after this socket dropped.
      streams.forEach(function (stream, generationId) {
        socket.send(JSON.stringify({type: "generation.resume", generation: generationId, after_seq: stream.seq}));
      });
      if (sending) transmit();  // written before the socket opened, or not yet answered on the last one
      if (regenerating) socket.send(JSON.stringify(regenerating));  // likewise
    });
    socket.addEventListener("message", function (event) {
      const msg = JSON.parse(event.data);
      handle(msg);
      // For the page's other scripts (static/chat/tree.js), after this one has handled it.
      chat.dispatchEvent(new CustomEvent("chat:frame", {detail: msg}));
    });
    socket.addEventListener("close", function (event) {
      chat.dataset.socket = "closed";
      if (event.code === 4401 || event.code === 4403) {
        // Signed out, a new password, or the account suspended: reconnecting cannot help. The
        // reload lands on the sign-in page, unless this page is already leaving (its own "Log out"
        // closes its socket before the response arrives, and a reload would cancel that navigation).
        setTimeout(function () { window.location.reload(); }, leaving ? 3000 : 0);
        return;
      }
      // 4429: the account has as many chat sockets open as it may (other tabs); one may close soon.
      const tooMany = event.code === 4429;
      connectionBanner.textContent = tooMany ? (event.reason || "Too many open chat tabs.") + " Close one; this tab retries." : "Reconnecting…";
      connectionBanner.hidden = false;
      setTimeout(connect, tooMany ? Math.max(retryDelay, 10000) : retryDelay);
      retryDelay = Math.min(retryDelay * 2, 10000);
    });
  }

  function handle(msg) {
    // The sidebar (static/chat/sidebar.js) keeps its list and the header's actions in step from here.
    document.dispatchEvent(new CustomEvent("chat:event", {detail: msg}));
    switch (msg.type) {
      case "engine.status":
        engineBanner.dataset.state = msg.state;
        engineBanner.hidden = msg.state === "ready";
        engineBanner.textContent = ENGINE_STATES[msg.state] || ENGINE_STATES.loading;
        break;
      case "conversation.summary":
        showSummary(msg);
        break;
      case "conversation.created": {
        if (conversationId === msg.conversation.id) break;  // told again in answer to a retry
        conversationId = msg.conversation.id;
        chat.dataset.conversation = String(conversationId);
        const url = chat.dataset.conversationUrl.replace("/0/", "/" + conversationId + "/");
        history.replaceState(null, "", url);
        document.getElementById("chat-title").textContent = msg.conversation.title;
        break;
      }
      case "message.accepted":
        if (isOurs(msg)) {
          sending.userEl.dataset.parent = msg.user_message.parent === null ? "" : msg.user_message.parent;
          sending.userEl.dataset.siblings = (msg.user_message.siblings || [msg.user_message.id]).join(",");
          sending.userEl.dataset.message = msg.user_message.id;
          sending.assistantEl.dataset.parent = msg.user_message.id;
          sending.assistantEl.dataset.siblings = String(msg.assistant_message.id);
          sending.assistantEl.dataset.newestGeneration = msg.generation;
          sending.assistantEl.dataset.message = msg.assistant_message.id;
          if (msg.warning) addNote(sending.userEl, msg.warning, false);
          if (msg.model) answeredBy(sending.assistantEl, msg.model);
          if (msg.cached) addNote(sending.assistantEl, "Answered from the cache", false, "cached");
          follow(msg.generation, sending.assistantEl, 0);
          sending = null;
        }
        break;
      case "conversation.message": {
        // Sent from another of this user's tabs: shown here too when this page shows its conversation,
        // and its answer followed from the start of its stream.
        if (msg.conversation.id !== conversationId) break;
        if (messages.querySelector('article[data-message="' + msg.user_message.id + '"]')) break;
        const userEl = addMessage("user", msg.user_message.content, msg.blocked ? "flagged" : "complete");
        userEl.dataset.message = msg.user_message.id;
        if (msg.blocked) {
          addNote(userEl, msg.blocked, false);
          break;
        }
        const answerEl = addMessage("assistant", "", "pending");
        answerEl.dataset.message = msg.assistant_message.id;
        follow(msg.generation, answerEl, 0);
        refreshRegenerate();
        if (socket && socket.readyState === WebSocket.OPEN) {
          socket.send(JSON.stringify({type: "generation.resume", generation: msg.generation, after_seq: 0}));
        }
        break;
      }
      case "message.regenerating": {
        // The new answer goes beside the one asked about, and takes its place on the page.
        const ours = answerArrived(msg.regenerated);
        const el = messages.querySelector('article[data-message="' + msg.regenerated + '"]') ||
          messages.querySelector('article[data-message="' + msg.assistant_message.id + '"]');
        if (!el) {
          setBusy(streams.size > 0 || sending !== null);
          break;
        }
        el.querySelectorAll(".note, button.regenerate").forEach(function (n) { n.remove(); });
        // A replayed answer continued since has text before its generation's (the server's `text_before`).
        const before = msg.assistant_message.text_before || "";
        if (before) el.dataset.textBefore = before;
        else delete el.dataset.textBefore;
        ChatRender.render(el.querySelector(".content"), before);
        el.dataset.siblings = (msg.assistant_message.siblings || [msg.assistant_message.id]).join(",");
        el.dataset.newestGeneration = msg.generation;
        el.dataset.finishReason = "";
        el.dataset.rating = "";
        el.removeAttribute("title");
        el.dataset.message = msg.assistant_message.id;
        if (msg.model) answeredBy(el, msg.model);
        setStatus(el, "pending");
        follow(msg.generation, el, 0);
        if (ours) stopIfAsked(msg.generation);
        break;
      }
      case "message.continuing": {
        // The answer writes on after what it has: its new text is appended.
        const ours = answerArrived(msg.assistant_message.id);
        const el = messages.querySelector('article[data-message="' + msg.assistant_message.id + '"]');
        if (!el || streams.has(msg.generation)) {
          setBusy(streams.size > 0 || sending !== null);
          break;
        }
        el.querySelectorAll(".note, button.regenerate").forEach(function (n) { n.remove(); });
        const content = el.querySelector(".content");
        if (el.dataset.textBefore === undefined) el.dataset.textBefore = ChatRender.source(content);
        ChatRender.render(content, el.dataset.textBefore);
        el.dataset.finishReason = "";
        // The newest answer is now written by this generation: a later Regenerate names it
        // (naming the one before would ask for this continuation again).
        if (el.dataset.newestGeneration === el.dataset.generation) el.dataset.newestGeneration = msg.generation;
        setStatus(el, "pending");
        follow(msg.generation, el, 0);
        if (ours) stopIfAsked(msg.generation);
        break;
      }
      case "message.blocked":
        // Moderation held the message back: it is saved (flagged) but no answer is coming.
        if (isOurs(msg)) {
          sending.userEl.dataset.message = msg.user_message.id;
          setStatus(sending.userEl, "flagged");
          addNote(sending.userEl, msg.message, false);
          sending.assistantEl.remove();
          sending = null;
          setBusy(streams.size > 0);
        }
        break;
      case "generation.delta": {
        const stream = streams.get(msg.generation);
        if (!stream || msg.seq <= stream.seq) break;
        stream.seq = msg.seq;
        stream.heard = Date.now();
        setStatus(stream.el, "streaming");
        ChatRender.append(stream.el.querySelector(".content"), msg.text);
        break;
      }
      case "generation.done":
      case "generation.error": {
        const stream = streams.get(msg.generation);
        if (!stream) break;
        streams.delete(msg.generation);
        const content = stream.el.querySelector(".content");
        // Complete now: the streamed text, or msg.text where given (a continued answer's text so far
        // comes before its generation's).
        ChatRender.render(content, typeof msg.text === "string" ? (stream.el.dataset.textBefore || "") + msg.text : undefined);
        delete stream.el.dataset.textBefore;
        stream.el.dataset.finishReason = msg.finish_reason || "";
        if (msg.usage && msg.usage.completion_tokens !== undefined) {
          const seconds = (performance.now() - stream.since) / 1000;
          stream.el.title = msg.usage.completion_tokens + " tokens · " + seconds.toFixed(1) + " s";
        }
        if (msg.type === "generation.error") {
          setStatus(stream.el, "failed");
          addNote(stream.el, "This answer failed: " + msg.message, true);
        } else {
          if (msg.finish_reason === "content_filter") {
            setStatus(stream.el, "flagged");
            addNote(stream.el, chat.dataset.answerCutNote, false);
          } else {
            setStatus(stream.el, msg.status);
          }
          if (msg.status === "stopped" && msg.finish_reason !== "content_filter") addNote(stream.el, "Stopped", false);
          else if (msg.finish_reason === "length" && msg.status === "complete") {
            addNote(stream.el, "The answer reached its length limit.", false);
            stream.el.lastChild.classList.add("length");
          }
        }
        if (streams.size === 0) setBusy(false);
        refreshRegenerate();
        break;
      }
      case "error":
        if (isOurs(msg)) {
          takeBack();  // the pending message was refused
        } else if (regenerating) {
          // A refused regenerate or continue: idle again, and its button comes back.
          regenerating = null;
          stopOnArrival = false;
          setBusy(streams.size > 0 || sending !== null);
        }
        showError(msg.message);
        refreshRegenerate();
        break;
    }
  }

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    const text = input.value.trim();
    if (!text) return;
    // After the last message on the page: the branch shown.
    const last = messages.querySelector("article.message:last-of-type");
    if (sendFrom(last && last.dataset.message ? parseInt(last.dataset.message, 10) : undefined, text, null)) {
      input.value = "";
    }
  });

  // Send `text` after message `parent` (null: a new branch from the start; undefined: the branch
  // shown). `replacing`: the message an edit goes beside; it and what follows it leave the page.
  function sendFrom(parent, text, replacing) {
    if (sending || regenerating || streams.size > 0) return false;
    showError("");
    // The images attached for this message (static/chat/files.js): sent once each has been read.
    const images = window.chatPage.imagesForSend ? window.chatPage.imagesForSend() : {ready: [], waiting: false};
    if (images.waiting) {
      showError("An image is still being read. Send the message once it shows as ready.");
      return false;
    }
    const payload = {type: "message.send", content: text, conversation: conversationId, client_id: newClientId()};
    if (images.ready.length) payload.images = images.ready.map(function (image) { return image.id; });
    // The tools the service runs (docs/tools.md): on or off for this chat, and `/search …`, `/files …`,
    // `/fetch …` or `/run …` asks for that tool by name, so that even a small model calls it.
    const toolsToggle = document.getElementById("tools-toggle");
    if (toolsToggle) payload.tools = toolsToggle.checked;
    const command = /^\/(search|files|fetch|run)\s+([\s\S]+)$/.exec(text);
    if (command) {
      payload.tool = TOOL_COMMANDS[command[1]];
      payload.content = command[2].trim();
    }
    if (modelSelect) payload.model = modelSelect.value;  // another model: from this message on
    if (!conversationId && chat.dataset.project) payload.project = parseInt(chat.dataset.project, 10);  // a project's page
    if (conversationId && parent !== undefined) payload.parent = parent;
    const removed = [];
    for (let el = replacing; el; el = el.nextElementSibling) removed.push(el);
    removed.forEach(function (el) { el.remove(); });
    sending = {
      payload: payload,
      removed: removed,
      userEl: withImages(addMessage("user", text, "complete"), images.ready),
      assistantEl: addMessage("assistant", "", "pending"),
    };
    setBusy(true);
    refreshRegenerate();
    // Not connected (yet, or any more): the message waits, and goes as soon as a socket opens.
    if (socket && socket.readyState === WebSocket.OPEN) transmit();
    return true;
  }

  // The page's CSRF token, for the requests the other scripts make to its endpoints.
  function csrfToken() {
    const field = document.querySelector("input[name=csrfmiddlewaretoken]");
    return field ? field.value : "";
  }

  // What the page's other scripts ask of this one (static/chat/tree.js: edits, Continue), loaded after it.
  // An answer's tool loop (static/chat/tools.js): while its calls run, its step's stream is not asked
  // for again; the next step is followed in the same place on the page.
  function toolPause(generationId) {
    const stream = streams.get(generationId);
    if (stream) stream.paused = true;
  }

  function toolStep(fromGeneration, toGeneration, message) {
    const stream = streams.get(fromGeneration);
    // An answer drawn by the server between its steps (a page loaded while another tab's calls ran).
    const el = stream ? stream.el : messages.querySelector('article.message.assistant[data-generation="' + fromGeneration + '"]');
    if (!el) return null;
    streams.delete(fromGeneration);
    el.dataset.message = message.id;
    el.dataset.parent = message.parent;
    el.dataset.siblings = String(message.id);
    el.dataset.newestGeneration = toGeneration;
    ChatRender.render(el.querySelector(".content"), "");
    setStatus(el, "pending");
    follow(toGeneration, el, 0);
    return el;
  }

  function toolStopped(generationId) {
    const stream = streams.get(generationId);
    if (!stream) return;
    streams.delete(generationId);
    setStatus(stream.el, "stopped");
    addNote(stream.el, "Stopped", false);
    if (streams.size === 0) setBusy(false);
    refreshRegenerate();
  }

  // A step whose loop ended with the tab that drove it: it ends as it is, with `note` under it.
  function toolEnded(generationId, note) {
    const stream = streams.get(generationId);
    if (!stream) return;
    streams.delete(generationId);
    ChatRender.render(stream.el.querySelector(".content"));
    setStatus(stream.el, "complete");
    if (note) addNote(stream.el, note, false, "tool-note");
    if (streams.size === 0) setBusy(false);
    refreshRegenerate();
  }

  function sendFrame(frame) {
    if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(frame));
  }

  window.chatPage = {
    sendFrom: sendFrom, requestAnswer: requestAnswer, csrfToken: csrfToken, imageCaption: imageCaption,
    toolPause: toolPause, toolStep: toolStep, toolStopped: toolStopped, toolEnded: toolEnded, send: sendFrame,
  };

  input.addEventListener("keydown", function (event) {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      form.requestSubmit();
    }
  });

  stopButton.addEventListener("click", function () {
    // A message still waiting for a socket has reached no server: Stop takes it back. One that was
    // sent may have arrived, so it stays until the server answers for it.
    if (sending && !sending.payload.retry) {
      takeBack();
      return;
    }
    // A regenerate or continue the server has not answered yet: its answer is stopped as it begins.
    if (regenerating && streams.size === 0) stopOnArrival = true;
    if (!socket || socket.readyState !== WebSocket.OPEN) return;
    streams.forEach(function (stream, generationId) {
      socket.send(JSON.stringify({type: "generation.stop", generation: generationId}));
    });
  });

  // Answers that were still being written when this page was rendered: resume them on connect. The
  // others are drawn from the text the server put in them.
  messages.querySelectorAll("article.message.assistant").forEach(function (el) {
    const content = el.querySelector(".content");
    if ((el.dataset.status === "pending" || el.dataset.status === "streaming") && el.dataset.generation) {
      ChatRender.render(content, el.dataset.textBefore || "");
      follow(el.dataset.generation, el, 0);
    } else {
      ChatRender.render(content, content.textContent);
    }
  });

  // An answer whose end never reaches the page (an event lost on the way, an answer ended where no
  // stream announced it) would wait for ever: one quiet for QUIET_MS is asked for again. The server
  // answers with what the page missed, or with the answer's end from its row.
  const QUIET_MS = 4000;
  setInterval(function () {
    if (!socket || socket.readyState !== WebSocket.OPEN) return;
    const now = Date.now();
    streams.forEach(function (stream, generationId) {
      if (stream.paused || now - stream.heard < QUIET_MS) return;
      stream.heard = now;
      socket.send(JSON.stringify({type: "generation.resume", generation: generationId, after_seq: stream.seq}));
    });
  }, 1000);

  refreshRegenerate();
  connect();
})();
