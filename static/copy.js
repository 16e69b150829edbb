// A Copy button (data-copy="<id of the element whose text it copies>"), for a new API key. The
// clipboard API needs a secure context (https or localhost); elsewhere the text is selected instead,
// for the person to copy by hand.
document.addEventListener("click", (event) => {
  const button = event.target.closest && event.target.closest("button[data-copy]");
  if (!button) return;
  const source = document.getElementById(button.dataset.copy);
  const result = document.getElementById("copy-result");
  const say = (text) => { if (result) result.textContent = text; };
  const select = () => {
    const range = document.createRange();
    range.selectNodeContents(source);
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    say("Selected: press Ctrl+C (⌘C on a Mac) to copy.");
  };
  if (!navigator.clipboard || !window.isSecureContext) {
    select();
    return;
  }
  navigator.clipboard.writeText(source.textContent.trim()).then(() => say("Copied."), select);
});
