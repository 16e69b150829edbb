// Passkeys: registering one (the settings page) and signing in with one (the second step, or the
// sign-in page alone). The server makes the options and checks the answers (accounts/passkeys.py);
// this only turns their base64url fields into the bytes navigator.credentials wants, and back.
(() => {
  "use strict";

  const toBytes = (text) => {
    const base64 = text.replace(/-/g, "+").replace(/_/g, "/") + "===".slice((text.length + 3) % 4);
    return Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
  };
  const toText = (buffer) => {
    let binary = "";
    for (const byte of new Uint8Array(buffer)) binary += String.fromCharCode(byte);
    return btoa(binary).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  };
  const descriptors = (list) => (list || []).map((d) => ({ ...d, id: toBytes(d.id) }));

  const creationOptions = (o) => ({
    ...o,
    challenge: toBytes(o.challenge),
    user: { ...o.user, id: toBytes(o.user.id) },
    excludeCredentials: descriptors(o.excludeCredentials),
  });
  const requestOptions = (o) => ({ ...o, challenge: toBytes(o.challenge), allowCredentials: descriptors(o.allowCredentials) });

  const credentialJSON = (credential) => {
    const r = credential.response;
    const response = { clientDataJSON: toText(r.clientDataJSON) };
    if (r.attestationObject) {
      response.attestationObject = toText(r.attestationObject);
      response.transports = typeof r.getTransports === "function" ? r.getTransports() : [];
    } else {
      response.authenticatorData = toText(r.authenticatorData);
      response.signature = toText(r.signature);
      if (r.userHandle) response.userHandle = toText(r.userHandle);
    }
    return {
      id: credential.id,
      rawId: toText(credential.rawId),
      type: credential.type,
      response,
      clientExtensionResults: credential.getClientExtensionResults(),
      authenticatorAttachment: credential.authenticatorAttachment || undefined,
    };
  };

  const post = async (url, token, body) => {
    const response = await fetch(url, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRFToken": token },
      body: body === undefined ? "{}" : JSON.stringify(body),
    });
    const data = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error((data.error && data.error.message) || "That did not work. Try again.");
    return data;
  };

  const say = (element, text) => {
    const place = element.querySelector("[data-passkey-error]") || element.parentElement.querySelector("[data-passkey-error]");
    if (place) place.textContent = text;
  };

  const failure = (error) =>
    error && error.name === "NotAllowedError" ? "The passkey request was cancelled or timed out." : error.message;

  // <form data-passkey="register" data-options="…" action="…">: a name, then the authenticator.
  for (const form of document.querySelectorAll("form[data-passkey=register]")) {
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const token = form.querySelector("[name=csrfmiddlewaretoken]").value;
      say(form, "");
      try {
        const options = await post(form.dataset.options, token);
        const credential = await navigator.credentials.create({ publicKey: creationOptions(options) });
        const name = form.querySelector("[name=name]").value;
        const done = await post(form.action, token, { name, credential: credentialJSON(credential) });
        window.location.assign(done.redirect);
      } catch (error) {
        say(form, failure(error));
      }
    });
  }

  // <form data-passkey="authenticate" data-options="…" action="…">: sign in with a passkey.
  for (const form of document.querySelectorAll("form[data-passkey=authenticate]")) {
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const token = form.querySelector("[name=csrfmiddlewaretoken]").value;
      say(form, "");
      try {
        const options = await post(form.dataset.options, token);
        const credential = await navigator.credentials.get({ publicKey: requestOptions(options) });
        const done = await post(form.action, token, { credential: credentialJSON(credential) });
        window.location.assign(done.redirect);
      } catch (error) {
        say(form, failure(error));
      }
    });
  }
})();
