// Forms that ask before they act (delete a conversation, revoke a key): the question lives in the
// form's data-confirm attribute, since the Content-Security-Policy refuses inline handlers.
document.addEventListener("submit", (event) => {
  const question = event.target.dataset && event.target.dataset.confirm;
  if (question && !window.confirm(question)) event.preventDefault();
});
