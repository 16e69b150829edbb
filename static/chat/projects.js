// Projects on the chat page: the sidebar's projects (each opening to its chats) and "New project", a
// project's page (its chats; its name, instructions, default model and files; deleting it with or
// without its chats), and moving a chat into or out of a project. Another script moves a chat with
// `window.chatProjects.moveDialog(conversationId)`, a Promise of the project it ended in (an id, null
// for none, undefined when cancelled). Names and titles are user text: they go in as text only.
(function () {
  "use strict";
  const chat = document.getElementById("chat");
  const nav = document.getElementById("project-list");
  const holder = document.getElementById("projects");
  const dated = document.getElementById("conversation-list");
  const search = document.getElementById("conversation-search");
  const errorBanner = document.getElementById("request-error");
  const page = document.getElementById("project-page");
  const moveButton = document.getElementById("move-project");
  if (!nav) return;

  const csrfToken = window.chatPage.csrfToken;  // static/chat.js, loaded first

  function showError(text) {
    errorBanner.textContent = text;
    errorBanner.hidden = !text;
  }

  function currentConversation() {
    return chat.dataset.conversation ? parseInt(chat.dataset.conversation, 10) : null;
  }

  // One of the projects API's calls (conversations/project_apis.py): its JSON (null for no body), or
  // a rejection with the server's message.
  function api(method, url, body) {
    const headers = {"X-CSRFToken": csrfToken(), "Accept": "application/json"};
    if (body !== undefined && !(body instanceof FormData)) headers["Content-Type"] = "application/json";
    return fetch(url, {
      method: method,
      credentials: "same-origin",
      headers: headers,
      body: body === undefined || body instanceof FormData ? body : JSON.stringify(body),
    }).then(function (response) {
      if (response.status === 204) return null;
      return response.json().catch(function () { return {}; }).then(function (data) {
        if (!response.ok) throw new Error((data.error && data.error.message) || "That did not work. Try again.");
        return data;
      });
    });
  }

  // --- the sidebar's projects ----------------------------------------------------------------------

  function chatLink(c) {
    const link = document.createElement("a");
    link.href = c.url;
    link.className = "project-chat";
    link.dataset.conversation = String(c.id);
    link.textContent = c.title;
    if (c.id === currentConversation()) {
      link.classList.add("active");
      link.setAttribute("aria-current", "page");
    }
    return link;
  }

  function emptyNote() {
    const note = document.createElement("p");
    note.className = "project-empty muted";
    note.textContent = "No chats yet";
    return note;
  }

  function drawProjects(projects) {
    const open = new Set(Array.from(holder.querySelectorAll("details.project[open]"), function (d) { return d.dataset.project; }));
    holder.textContent = "";
    projects.forEach(function (p) {
      const details = document.createElement("details");
      details.className = "project";
      details.dataset.project = String(p.id);
      details.open = open.has(String(p.id)) || p.chats.some(function (c) { return c.id === currentConversation(); });
      const summary = document.createElement("summary");
      const link = document.createElement("a");
      link.href = p.url;
      link.className = "project-link";
      link.textContent = p.name;
      if (page && !currentConversation() && page.dataset.project === String(p.id)) {
        link.classList.add("active");
        link.setAttribute("aria-current", "page");
      }
      summary.appendChild(link);
      details.appendChild(summary);
      p.chats.forEach(function (c) { details.appendChild(chatLink(c)); });
      if (!p.chats.length) details.appendChild(emptyNote());
      holder.appendChild(details);
    });
    dedupe();
  }

  function refreshProjects() {
    return api("GET", nav.dataset.projectsUrl).then(drawProjects);
  }

  // A chat listed under its project is not in the dated list as well (sidebar.js puts a chat at the
  // top of that list as it becomes active); search results list every chat, projects' too.
  function dedupe() {
    if (search.value.trim()) return;
    holder.querySelectorAll("a.project-chat").forEach(function (a) {
      const twin = dated.querySelector('a.conversation-link[data-conversation="' + a.dataset.conversation + '"]');
      if (twin) twin.remove();
    });
    dated.querySelectorAll("section.conversation-group").forEach(function (section) {
      if (!section.querySelector("a.conversation-link")) section.remove();
    });
  }

  // --- dialogs ---------------------------------------------------------------------------------------

  // A modal with `fields`, Cancel and a confirm button; `confirm` returns a Promise, and the dialog
  // stays open with its error shown when it rejects. Resolves with what `confirm` resolved with, or
  // undefined when cancelled.
  function dialog(id, heading, fields, confirmLabel, confirm) {
    const old = document.getElementById(id);
    if (old) old.remove();
    const box = document.createElement("dialog");
    box.id = id;
    box.className = "project-dialog";
    const form = document.createElement("form");
    const title = document.createElement("h2");
    title.textContent = heading;
    const error = document.createElement("p");
    error.className = "project-dialog-error";
    error.setAttribute("role", "alert");
    error.hidden = true;
    const buttons = document.createElement("div");
    buttons.className = "project-dialog-buttons";
    const cancel = document.createElement("button");
    cancel.type = "button";
    cancel.className = "link";
    cancel.textContent = "Cancel";
    const ok = document.createElement("button");
    ok.type = "submit";
    ok.className = "project-dialog-confirm";
    ok.textContent = confirmLabel;
    buttons.append(cancel, ok);
    form.append(title, ...fields, error, buttons);
    box.appendChild(form);
    document.body.appendChild(box);
    return new Promise(function (resolve) {
      let result;
      box.addEventListener("close", function () { box.remove(); resolve(result); });
      cancel.addEventListener("click", function () { box.close(); });
      form.addEventListener("submit", function (event) {
        event.preventDefault();
        ok.disabled = true;
        confirm().then(function (value) {
          result = value;
          box.close();
        }, function (failure) {
          ok.disabled = false;
          error.textContent = failure.message;
          error.hidden = false;
        });
      });
      box.showModal();
    });
  }

  function labelled(text, control) {
    const label = document.createElement("label");
    label.append(text, control);
    return label;
  }

  document.getElementById("new-project").addEventListener("click", function () {
    const name = document.createElement("input");
    name.type = "text";
    name.id = "new-project-name";
    name.maxLength = 100;
    name.required = true;
    dialog("project-new-dialog", "New project", [labelled("Name", name)], "Create", function () {
      return api("POST", nav.dataset.projectsUrl, {name: name.value});
    }).then(function (project) {
      if (project) location.href = project.url;
    });
  });

  // --- moving a chat --------------------------------------------------------------------------------

  function projectHeaderShow(conversationId, project) {
    if (conversationId !== currentConversation()) return;
    let link = document.getElementById("chat-project");
    if (moveButton) moveButton.dataset.project = project ? String(project.id) : "";
    if (!project) {
      if (link) link.remove();
      return;
    }
    if (!link) {
      link = document.createElement("a");
      link.id = "chat-project";
      link.className = "chat-project";
      document.getElementById("chat-title").before(link);
    }
    link.href = project.url;
    link.textContent = project.name;
  }

  function moveDialog(conversationId) {
    return api("GET", nav.dataset.projectsUrl).then(function (projects) {
      const current = projects.find(function (p) {
        return p.chats.some(function (c) { return c.id === conversationId; });
      });
      const select = document.createElement("select");
      select.id = "move-project-choice";
      const none = document.createElement("option");
      none.value = "";
      none.textContent = "No project";
      select.appendChild(none);
      projects.forEach(function (p) {
        const option = document.createElement("option");
        option.value = String(p.id);
        option.textContent = p.name;
        select.appendChild(option);
      });
      select.value = current ? String(current.id) : "";
      const moveTo = function () {
        const chosen = select.value ? parseInt(select.value, 10) : null;
        return api("PUT", "/api/conversations/" + conversationId + "/project/", {project: chosen});
      };
      return dialog("project-move-dialog", "Move to project", [labelled("Project", select)], "Move", moveTo);
    }).then(function (moved) {
      if (!moved) return undefined;
      return Promise.all([refreshProjects(), window.chatSidebar ? window.chatSidebar.refresh() : null]).then(function () {
        dedupe();
        const link = moved.project ? holder.querySelector('details.project[data-project="' + moved.project + '"] a.project-link') : null;
        projectHeaderShow(conversationId, link ? {id: moved.project, url: link.href, name: link.textContent} : null);
        document.dispatchEvent(new CustomEvent("chat:project-moved", {detail: {conversation: conversationId, project: moved.project}}));
        return moved.project;
      });
    }).catch(function (failure) {
      showError(failure.message);
      return undefined;
    });
  }

  window.chatProjects = {moveDialog: moveDialog, refresh: refreshProjects};

  // "Move to project" in each chat's "…" menu in the sidebar (static/chat/chatmenu.js, loaded after this).
  function addMenuItem() {
    window.chatMenu.addItem({label: "Move to project…", onSelect: function (id) { moveDialog(id); }});
  }
  if (window.chatMenu) addMenuItem();
  else document.addEventListener("chatmenu:ready", addMenuItem, {once: true});

  if (moveButton) {
    moveButton.addEventListener("click", function () {
      const id = currentConversation();
      if (id) moveDialog(id);
    });
  }

  // --- the socket's news ------------------------------------------------------------------------------

  document.addEventListener("chat:event", function (event) {
    const msg = event.detail;
    switch (msg.type) {
      case "conversation.created": {
        // Started from a project's page: it is that project's first (or newest) chat.
        if (!page || !chat.dataset.project) break;
        page.hidden = true;
        const details = holder.querySelector('details.project[data-project="' + chat.dataset.project + '"]');
        if (details) {
          details.open = true;
          details.querySelectorAll(".project-empty").forEach(function (n) { n.remove(); });
          details.querySelectorAll("a.project-link.active").forEach(function (a) {
            a.classList.remove("active");
            a.removeAttribute("aria-current");
          });
          const url = chat.dataset.conversationUrl.replace("/0/", "/" + msg.conversation.id + "/");
          const link = chatLink({id: msg.conversation.id, title: msg.conversation.title, url: url});
          details.querySelector("summary").after(link);
          const header = details.querySelector("a.project-link");
          projectHeaderShow(msg.conversation.id, {id: chat.dataset.project, url: header.href, name: header.textContent});
        }
        dedupe();
        break;
      }
      case "conversation.title":
        holder.querySelectorAll('a.project-chat[data-conversation="' + msg.conversation + '"]').forEach(function (a) {
          a.textContent = msg.title;
        });
        break;
      case "conversation.message":
      case "message.accepted":
        dedupe();
        break;
    }
  });
  dedupe();

  // --- a project's page ---------------------------------------------------------------------------------

  if (!page) return;
  const form = document.getElementById("project-form");
  const saved = document.getElementById("project-saved");
  const files = document.getElementById("project-files");

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    saved.textContent = "";
    const body = {
      name: document.getElementById("project-name").value,
      instructions: document.getElementById("project-instructions").value,
      default_model: document.getElementById("project-model").value,
    };
    api("PATCH", page.dataset.apiUrl, body).then(function (project) {
      saved.textContent = "Saved";
      showError("");
      const header = document.getElementById("chat-project");
      if (header) header.textContent = project.name;
      if (!currentConversation()) {
        document.getElementById("chat-title").textContent = "New chat in " + project.name;
        const picker = document.getElementById("model");
        if (project.default_model && picker) picker.value = project.default_model;
      }
      return refreshProjects();
    }).catch(function (failure) { showError(failure.message); });
  });

  function fileShow(file) {
    let item = files.querySelector('li[data-document="' + file.id + '"]');
    if (!item) {
      item = document.createElement("li");
      const name = document.createElement("span");
      name.className = "file-name";
      const state = document.createElement("span");
      state.className = "file-status";
      item.append(name, " ", state);
      files.appendChild(item);
    }
    item.dataset.document = String(file.id);
    item.dataset.status = file.status;
    item.querySelector(".file-name").textContent = file.name;
    item.querySelector(".file-status").textContent =
      file.status === "ready" ? "ready" : file.status === "failed" ? "failed: " + file.error : "processing " + (file.progress || 0) + "%";
  }

  function follow(id) {
    api("GET", "/api/files/" + id + "/").then(function (file) {
      fileShow(file);
      if (file.status === "queued" || file.status === "processing") setTimeout(function () { follow(id); }, 700);
    }, function () { setTimeout(function () { follow(id); }, 2000); });
  }

  files.querySelectorAll("li[data-document]").forEach(function (item) {
    if (item.dataset.status === "queued" || item.dataset.status === "processing") follow(item.dataset.document);
  });

  document.getElementById("project-file").addEventListener("change", function (event) {
    const file = event.target.files[0];
    if (!file) return;
    const body = new FormData();
    body.append("file", file);
    api("POST", page.dataset.filesUrl, body).then(function (created) {
      showError("");
      fileShow(created);
      follow(created.id);
    }).catch(function (failure) { showError(failure.message); });
    event.target.value = "";
  });

  // Deleting asks what becomes of the project's chats: the form's choice is required, here and by the server.
  document.getElementById("project-delete").addEventListener("submit", function (event) {
    event.preventDefault();
    const choice = event.target.querySelector("input[name=chats]:checked");
    if (!choice) return;
    api("DELETE", page.dataset.apiUrl + "?chats=" + encodeURIComponent(choice.value))
      .then(function () { location.href = "/"; })
      .catch(function (failure) { showError(failure.message); });
  });
})();
