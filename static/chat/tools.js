// The tools the service runs in an answer (docs/tools.md): each call shown as a collapsible step in the
// answer ("Searched the web for …", with what it was called with and what came back), and a call with
// side effects shown in a dialog that asks before anything runs. The server's frames (`tool.*`) come
// through static/chat.js's `chat:frame` event; everything a tool or the model wrote goes in as text.
// A loop another tab of the person's drives comes the same way, its frames marked `elsewhere`: shown
// alike, but its questions are answered only in the tab that asked.
(function () {
  "use strict";
  const chat = document.getElementById("chat");
  const page = window.chatPage;  // static/chat.js, loaded first
  if (!chat || !page) return;

  const OUTCOMES = {
    failed: "failed", invalid: "not run: invalid call", timeout: "timed out", refused: "not allowed",
    withheld: "result withheld", not_run: "not run",
  };

  // The same words as conversations/views.py's tool_step_label, for a step shown live.
  function label(name, argumentsText, outcome, running) {
    let args = {};
    try { args = JSON.parse(argumentsText || "{}") || {}; } catch (e) { args = {}; }
    const said = {
      web_search: [running ? "Searching the web for “" : "Searched the web for “", (args.query || "") + "”"],
      search_files: [running ? "Searching your files for “" : "Searched your files for “", (args.query || "") + "”"],
      fetch_page: [running ? "Reading " : "Read ", args.url || "a page"],
      run_code: [running ? "Running code" : "Ran code", ""],
    }[name] || [(running ? "Using " : "Used ") + name, ""];
    const text = said[0] + said[1];
    return !outcome || outcome === "ok" ? text : text + " (" + (OUTCOMES[outcome] || outcome) + ")";
  }

  function answerOf(generationId) {
    return document.querySelector('article.message[data-generation="' + generationId + '"]');
  }

  function stepsOf(el) {
    let steps = el.querySelector(":scope > .tool-steps");
    if (!steps) {
      steps = document.createElement("div");
      steps.className = "tool-steps";
      el.querySelector(":scope > .content").before(steps);
    }
    return steps;
  }

  function part(tag, className, text) {
    const node = document.createElement(tag);
    node.className = className;
    node.textContent = text;
    return node;
  }

  function addStep(el, generationId, call) {
    const details = document.createElement("details");
    details.className = "tool-step";
    details.dataset.generation = generationId;
    details.dataset.call = call.id;
    details.dataset.tool = call.name;
    details.dataset.outcome = "running";
    details.dataset.arguments = call.arguments;
    details.append(
      part("summary", "", label(call.name, call.arguments, "", true)),
      part("div", "tool-label", "Called with"),
      part("pre", "tool-arguments", call.arguments),
    );
    stepsOf(el).appendChild(details);
    return details;
  }

  function stepFor(msg, call) {
    const el = answerOf(msg.generation);
    if (!el) return null;
    return el.querySelector('.tool-step[data-call="' + CSS.escape(call) + '"]');
  }

  // --- asking before a call with side effects --------------------------------------------------------
  const dialog = document.createElement("dialog");
  dialog.id = "tool-approval";
  dialog.className = "tool-approval";
  dialog.setAttribute("aria-labelledby", "tool-approval-title");
  const title = part("h2", "", "Allow this tool to run?");
  title.id = "tool-approval-title";
  const what = part("p", "tool-approval-what", "");
  const args = part("pre", "tool-arguments", "");
  const buttons = document.createElement("div");
  buttons.className = "tool-approval-buttons";
  const choices = [["once", "Allow once"], ["chat", "Allow for this chat"], ["deny", "Deny"]];
  choices.forEach(function (choice) {
    const button = part("button", choice[0] === "deny" ? "link" : "", choice[1]);
    button.type = "button";
    button.dataset.decision = choice[0];
    button.addEventListener("click", function () { answer(choice[0]); });
    buttons.appendChild(button);
  });
  dialog.append(title, what, args, buttons);
  document.body.appendChild(dialog);
  let asking = null;  // the tool.approval frame the dialog shows
  const queue = [];

  function ask(msg) {
    if (asking) { queue.push(msg); return; }
    asking = msg;
    what.textContent = "The assistant wants to run " + msg.call.name + " with:";
    args.textContent = msg.call.arguments;
    dialog.showModal();
  }

  function answer(decision) {
    if (!asking) return;
    page.send({type: "tool.approve", generation: asking.generation, call: asking.call.id, decision: decision});
    asking = null;
    dialog.close();
    if (queue.length) ask(queue.shift());
  }

  // Esc is a refusal: nothing runs without a yes.
  dialog.addEventListener("cancel", function (event) {
    event.preventDefault();
    answer("deny");
  });

  chat.addEventListener("chat:frame", function (event) {
    const msg = event.detail;
    switch (msg.type) {
      case "tool.calls": {
        const el = answerOf(msg.generation);
        if (!el) break;
        page.toolPause(msg.generation);
        // Told once by the tab that runs them; a page that read them from the step itself has them already.
        if (el.querySelector('.tool-step[data-generation="' + CSS.escape(msg.generation) + '"]')) break;
        msg.calls.forEach(function (call) { addStep(el, msg.generation, call); });
        break;
      }
      case "tool.approval": {
        const step = stepFor(msg, msg.call.id);
        if (step) step.dataset.outcome = "waiting";
        if (!msg.elsewhere) ask(msg);
        else if (step && !step.querySelector(".tool-waiting")) {
          step.querySelector("summary").after(part("div", "tool-label tool-waiting", "Waiting for your answer in the tab that asked"));
        }
        break;
      }
      case "tool.running": {
        const step = stepFor(msg, msg.call.id);
        if (!step) break;
        step.dataset.outcome = "running";
        step.querySelectorAll(".tool-waiting").forEach(function (n) { n.remove(); });
        break;
      }
      case "tool.result": {
        const step = stepFor(msg, msg.call);
        if (!step) break;
        step.querySelectorAll(".tool-waiting").forEach(function (n) { n.remove(); });
        step.dataset.outcome = msg.outcome;
        step.querySelector("summary").textContent = label(msg.name, step.dataset.arguments, msg.outcome, false);
        step.append(
          part("div", "tool-label", "Result" + (msg.truncated ? " (cut at its size limit)" : "")),
          part("pre", "tool-output", msg.output),
        );
        break;
      }
      case "tool.step": {
        const el = page.toolStep(msg.previous, msg.generation, msg.assistant_message);
        if (el && msg.note) el.querySelector(":scope > .content").before(part("div", "note tool-note", msg.note));
        // The tab that drives the loop follows its next step itself; this one asks for its stream.
        if (el && msg.elsewhere) page.send({type: "generation.resume", generation: msg.generation, after_seq: 0});
        break;
      }
      case "tool.ended": {
        // The tab that drove the loop has gone: the calls shown will not run, and the answer ends here.
        const el = answerOf(msg.generation);
        if (el) {
          el.querySelectorAll('.tool-step[data-outcome="running"], .tool-step[data-outcome="waiting"]').forEach(function (step) {
            step.dataset.outcome = "not_run";
            step.querySelectorAll(".tool-waiting").forEach(function (n) { n.remove(); });
            step.querySelector("summary").textContent = label(step.dataset.tool, step.dataset.arguments, "not_run", false);
          });
        }
        page.toolEnded(msg.generation, msg.note);
        break;
      }
      case "tool.stopped":
        if (asking && asking.generation === msg.generation) { asking = null; dialog.close(); }
        page.toolStopped(msg.generation);
        break;
    }
  });
})();
