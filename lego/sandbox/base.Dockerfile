# The sandbox base image for machines that reach an image registry; the offline path
# (debootstrap + docker import, lego/sandbox/image.py) builds the same contents without one.
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends \
      python3 python3-pytest python3-venv git socat patch procps ca-certificates less tmux \
    && rm -rf /var/lib/apt/lists/*
RUN printf '[user]\n\tname = lego\n\temail = lego@localhost\n[safe]\n\tdirectory = *\n[init]\n\tdefaultBranch = main\n' > /etc/gitconfig
ENV LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1 HOME=/root
