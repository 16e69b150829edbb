// Regenerate with another model: a small picker beside Regenerate (and Retry), listing the models
// of the composer's picker (those the person's plan includes). Choosing one regenerates that answer
// with it; the conversation stays on its own model. chat.js adds and removes the Regenerate button;
// this script follows it (a MutationObserver) and asks through window.chatPage, as tree.js does.
(function () {
  "use strict";
  const messages = document.getElementById("messages");
  const models = document.getElementById("model");
  if (!messages || !models) return;

  function picker() {
    const select = document.createElement("select");
    select.className = "regenerate-model";
    select.setAttribute("aria-label", "Regenerate with another model");
    select.add(new Option("With another model…", ""));
    Array.from(models.options).forEach(function (option) {
      select.add(new Option(option.textContent, option.value));
    });
    select.addEventListener("change", function () {
      const answer = select.closest("article.message");
      if (!select.value || !answer || !answer.dataset.message || !window.chatPage) return;
      // As Regenerate asks, with the model: `replaces` makes a request sent again regenerate once.
      const asked = window.chatPage.requestAnswer({
        type: "message.regenerate",
        message: parseInt(answer.dataset.message, 10),
        replaces: answer.dataset.newestGeneration || answer.dataset.generation || null,
        model: select.value,
      });
      if (!asked) select.value = "";
    });
    return select;
  }

  // One picker right after each Regenerate button, none without one.
  function follow() {
    messages.querySelectorAll("select.regenerate-model").forEach(function (select) {
      const before = select.previousElementSibling;
      if (!before || !before.matches("button.regenerate")) select.remove();
    });
    messages.querySelectorAll("button.regenerate").forEach(function (button) {
      const after = button.nextElementSibling;
      if (!after || !after.matches("select.regenerate-model")) button.after(picker());
    });
  }

  new MutationObserver(follow).observe(messages, {childList: true, subtree: true});
  follow();
})();
