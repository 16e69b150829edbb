// When each message was written: a <time> at the top of every message, its short local time (with
// the date when not today) as text and the full date and time as its title. The server puts the
// moment in `datetime` (UTC); messages of this visit get the moment the page first showed them.
(function () {
  "use strict";
  const messages = document.getElementById("messages");
  if (!messages) return;
  const clock = new Intl.DateTimeFormat(undefined, {hour: "2-digit", minute: "2-digit"});
  const dated = new Intl.DateTimeFormat(undefined, {month: "short", day: "numeric", hour: "2-digit", minute: "2-digit"});
  const full = new Intl.DateTimeFormat(undefined, {dateStyle: "full", timeStyle: "medium"});

  function label(time) {
    const at = new Date(time.dateTime);
    if (isNaN(at.getTime())) return;
    const today = at.toDateString() === new Date().toDateString();
    time.textContent = (today ? clock : dated).format(at);
    time.title = full.format(at);
  }

  function stamp(article, again) {
    const old = article.querySelector(":scope > time.message-time");
    if (old && !again) return;
    if (old) old.remove();
    const time = document.createElement("time");
    time.className = "message-time";
    time.dateTime = new Date().toISOString();
    article.prepend(time);
    label(time);
  }

  // A regenerated answer takes the place of the one before it on the page: its time is its own.
  const chat = document.getElementById("chat");
  if (chat) {
    chat.addEventListener("chat:frame", function (event) {
      const msg = event.detail;
      if (msg.type !== "message.regenerating" || msg.replayed) return;
      const article = messages.querySelector('article[data-message="' + msg.assistant_message.id + '"]');
      if (article) stamp(article, true);
    });
  }
  new MutationObserver(function (records) {
    records.forEach(function (record) {
      record.addedNodes.forEach(function (node) {
        if (node.matches && node.matches("article.message")) stamp(node);
      });
    });
  }).observe(messages, {childList: true});
  messages.querySelectorAll("article.message").forEach(function (article) {
    const time = article.querySelector(":scope > time.message-time");
    if (time) label(time);
    else stamp(article);
  });
})();
