// A conversation's own settings: the system prompt of its answers and their temperature, in a small
// panel under the conversation's actions. Read and saved through the conversations API
// (/api/conversations/<id>/settings/), which checks them against the person's plan: a refusal's
// message is shown as it comes, and nothing is saved.
(function () {
  "use strict";
  const chat = document.getElementById("chat");
  const button = document.getElementById("conversation-settings");
  const panel = document.getElementById("conversation-settings-panel");
  if (!chat || !button || !panel) return;
  const prompt = document.getElementById("conversation-system-prompt");
  const temperature = document.getElementById("conversation-temperature");
  const limits = document.getElementById("conversation-settings-limits");
  const error = document.getElementById("conversation-settings-error");
  const saved = document.getElementById("conversation-settings-saved");

  const csrfToken = window.chatPage.csrfToken;  // static/chat.js, loaded first

  function api(method, body) {
    return fetch("/api/conversations/" + chat.dataset.conversation + "/settings/", {
      method: method,
      credentials: "same-origin",
      headers: {"Content-Type": "application/json", "X-CSRFToken": csrfToken()},
      body: body === undefined ? undefined : JSON.stringify(body),
    }).then(function (response) {
      return response.json().catch(function () { return {}; }).then(function (data) {
        if (!response.ok) throw new Error((data.error && data.error.message) || "The settings could not be saved.");
        return data;
      });
    });
  }

  function showError(text) {
    error.textContent = text;
    error.hidden = !text;
  }

  function show(settings) {
    prompt.value = settings.system_prompt;
    temperature.value = settings.temperature === null ? "" : String(settings.temperature);
    temperature.min = String(settings.temperature_min);
    temperature.max = String(settings.temperature_max);
    prompt.maxLength = settings.system_prompt_chars;
    limits.textContent = "Your plan allows a system prompt of up to " + settings.system_prompt_chars +
      " characters and a temperature from " + settings.temperature_min + " to " + settings.temperature_max +
      ". Empty: the model's own. Both apply from the next answer on.";
  }

  function open(opened) {
    panel.hidden = !opened;
    button.setAttribute("aria-expanded", opened ? "true" : "false");
    showError("");
    saved.textContent = "";
    if (!opened) return;
    api("GET")
      .then(function (settings) { show(settings); prompt.focus(); })
      .catch(function (failure) { showError(failure.message); });
  }

  button.addEventListener("click", function () {
    if (chat.dataset.conversation) open(panel.hidden);
  });
  document.getElementById("conversation-settings-close").addEventListener("click", function () { open(false); });

  panel.addEventListener("submit", function (event) {
    event.preventDefault();
    showError("");
    saved.textContent = "";
    // Sent as typed: the server says what is out of bounds (a value the field cannot read included).
    const typed = temperature.value.trim();
    const value = typed === "" ? null : Number(typed);
    api("PUT", {system_prompt: prompt.value, temperature: typed !== "" && isNaN(value) ? typed : value})
      .then(function (settings) { show(settings); saved.textContent = "Saved."; })
      .catch(function (failure) { showError(failure.message); });
  });
})();
