# Image for the demo cluster: Python 3.11, a Java 17 runtime for Spark, and this project.
FROM python:3.11-slim-bookworm
# JAVA_HOME through a link made at build time, so the image builds on any architecture
# (the JDK's directory is named after it: java-17-openjdk-<architecture>).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
 && rm -rf /var/lib/apt/lists/* \
 && ln -s "$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")" /usr/lib/jvm/java-17 \
 && /usr/lib/jvm/java-17/bin/java -version
ENV JAVA_HOME=/usr/lib/jvm/java-17 \
    PYSPARK_PYTHON=/usr/local/bin/python \
    PYSPARK_DRIVER_PYTHON=/usr/local/bin/python \
    PYTHONUNBUFFERED=1
WORKDIR /opt/aeron-spark
COPY . .
RUN pip install --no-cache-dir .
