// rolltap ui: token strips load when they come near the screen; "earlier/more tokens" links
// extend a strip in place. Without JavaScript every link still leads to the call's own page.
"use strict";

async function fetchStrip(url) {
  const response = await fetch(url, { credentials: "same-origin" });
  if (!response.ok) throw new Error(`${response.status} ${await response.text()}`);
  const holder = document.createElement("div");
  holder.innerHTML = await response.text();
  return holder.querySelector(".strip");
}

async function fill(slot) {
  slot.dataset.state = "loading";
  try {
    const strip = await fetchStrip(slot.dataset.src);
    slot.replaceChildren(strip);
    slot.dataset.state = "loaded";
  } catch (e) {
    slot.dataset.state = "failed";
    slot.append(` (could not load: ${e.message})`);
  }
}

async function extend(link) {
  const strip = link.closest(".strip");
  const more = await fetchStrip(link.dataset.src);
  const toks = strip.querySelector(".toks");
  const added = more.querySelector(".toks");
  if (link.classList.contains("earlier")) {
    toks.prepend(...added.childNodes);
    link.replaceWith(...more.querySelectorAll("a.earlier"));
  } else {
    toks.append(...added.childNodes);
    link.replaceWith(...more.querySelectorAll("a.later"));
  }
}

document.addEventListener("click", (event) => {
  const link = event.target.closest("a.more[data-src]");
  if (!link) return;
  event.preventDefault();
  extend(link).catch((e) => link.append(` (could not load: ${e.message})`));
});

window.addEventListener("DOMContentLoaded", () => {
  const slots = document.querySelectorAll(".strip-slot[data-src]");
  if (!("IntersectionObserver" in window)) {
    slots.forEach(fill);
    return;
  }
  const observer = new IntersectionObserver((entries) => {
    for (const entry of entries) {
      if (entry.isIntersecting) {
        observer.unobserve(entry.target);
        fill(entry.target);
      }
    }
  }, { rootMargin: "600px 0px" });
  slots.forEach((slot) => observer.observe(slot));
});
