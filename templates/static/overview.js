// Refresh the counts, workers and per-minute chart every 3 s (no build step, no dependencies).
setInterval(() => {
  for (const live of document.querySelectorAll("[data-src]")) {
    fetch(live.dataset.src, {credentials: "same-origin"}).then(async (reply) => {
      if (reply.ok && !reply.redirected) live.innerHTML = await reply.text();
    }).catch(() => { /* the next tick tries again */ });
  }
}, 3000);
