// The shared page: its answers drawn as the chat page draws them (chat/render.js: markdown, code,
// math, with raw HTML kept as text and the result sanitized). Questions stay the text they are.
(function () {
  "use strict";
  document.querySelectorAll("#messages article.message.assistant .content").forEach(function (content) {
    ChatRender.render(content, content.textContent);
  });
})();
